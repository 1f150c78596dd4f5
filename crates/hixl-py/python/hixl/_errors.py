"""Exceptions of hixl: every error carries HIXL's numeric status and the offending value."""

from __future__ import annotations

from typing import Any, Dict, Optional, Type

__all__ = [
    "HixlError",
    "ParamInvalidError",
    "HixlTimeoutError",
    "NotConnectedError",
    "AlreadyConnectedError",
    "NotifyFailedError",
    "UnsupportedError",
    "ResourceExhaustedError",
    "FailedError",
    "TransferCancelledError",
    "PeerLostError",
    "HeartbeatLostError",
    "AuthError",
    "TransferTimeoutError",
    "RefusedError",
]


class HixlError(Exception):
    """Base of every hixl error.

    Attributes:
        status: HIXL's numeric status code (``hixl.Status``), e.g. 103900 for PARAM_INVALID.
        status_name: its name, e.g. ``"PARAM_INVALID"``.
        value: the offending value (an address, a peer, an option key...) when the error
            names one, else ``None``.
    """

    status: int = 503900
    status_name: str = "FAILED"

    def __init__(self, message: str, *, status: Optional[int] = None,
                 status_name: Optional[str] = None, value: Any = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        if status_name is not None:
            self.status_name = status_name
        self.value = value

    def __str__(self) -> str:
        return f"{self.args[0]} [{self.status_name} {self.status}]"


class ParamInvalidError(HixlError, ValueError):
    """A parameter was refused (HIXL ``PARAM_INVALID``, 103900): an unregistered or
    out-of-bounds address, a bad option, a zero timeout..."""

    status, status_name = 103900, "PARAM_INVALID"


class HixlTimeoutError(HixlError, TimeoutError):
    """An operation did not finish in its timeout (HIXL ``TIMEOUT``, 103901)."""

    status, status_name = 103901, "TIMEOUT"


class NotConnectedError(HixlError, ConnectionError):
    """No link to the peer (HIXL ``NOT_CONNECTED``, 103902)."""

    status, status_name = 103902, "NOT_CONNECTED"


class AlreadyConnectedError(HixlError):
    """A link to the peer exists already (HIXL ``ALREADY_CONNECTED``, 103903)."""

    status, status_name = 103903, "ALREADY_CONNECTED"


class NotifyFailedError(HixlError):
    """A notify could not be delivered (HIXL ``NOTIFY_FAILED``, 103904)."""

    status, status_name = 103904, "NOTIFY_FAILED"


class UnsupportedError(HixlError):
    """Not supported by this build or platform (HIXL ``UNSUPPORTED``, 103905)."""

    status, status_name = 103905, "UNSUPPORTED"


class ResourceExhaustedError(HixlError):
    """A queue or table is full (HIXL ``RESOURCE_EXHAUSTED``, 203900)."""

    status, status_name = 203900, "RESOURCE_EXHAUSTED"


class FailedError(HixlError):
    """Any other failure (HIXL ``FAILED``, 503900): a lost peer, a shut-down engine..."""

    status, status_name = 503900, "FAILED"


class TransferCancelledError(FailedError):
    """Work of an op that was cancelled before it started was withdrawn."""


class _PeerError(HixlError):
    """An error about one peer: ``peer`` names it, ``cause`` says why."""

    peer: str = ""
    cause: str = ""


class PeerLostError(_PeerError, FailedError, ConnectionError):
    """The link to a peer broke: it died, closed, reset the socket, or a transport below the
    link failed. The peer may be connected again.

    Attributes:
        peer: the peer.
        cause: why the link was lost.
    """


class HeartbeatLostError(PeerLostError):
    """The peer answered no heartbeat in time: it is dead, hung, or the network is cut."""


class AuthError(_PeerError, FailedError, PermissionError):
    """Mutual authentication with a peer failed: the ``hixl.AuthSecret`` differs or is
    missing on one side. ``cause`` says what did not match."""


class TransferTimeoutError(_PeerError, HixlTimeoutError):
    """An operation with a peer (a transfer, a connect, a notify...) did not finish in its
    timeout; ``cause`` names the operation and the timeout."""


class RefusedError(_PeerError):
    """The peer refused a request; ``status``/``status_name`` are the status it answered and
    ``cause`` its explanation. Each raised one is also an instance of the class that status
    picks (e.g. ``ParamInvalidError`` for ``PARAM_INVALID``)."""


_BY_STATUS: Dict[int, Type[HixlError]] = {
    c.status: c
    for c in (
        ParamInvalidError,
        HixlTimeoutError,
        NotConnectedError,
        AlreadyConnectedError,
        NotifyFailedError,
        UnsupportedError,
        ResourceExhaustedError,
        FailedError,
    )
}


_KINDS: Dict[str, Type[HixlError]] = {
    "cancelled": TransferCancelledError,
    "peer_lost": PeerLostError,
    "heartbeat_lost": HeartbeatLostError,
    "auth": AuthError,
    "timeout": TransferTimeoutError,
}

_REFUSED: Dict[Type[HixlError], Type[HixlError]] = {}


def _refused(base: Type[HixlError]) -> Type[HixlError]:
    """``RefusedError`` joined with the class the refusal's status picks (made once)."""
    if base is HixlError:
        return RefusedError
    cls = _REFUSED.get(base)
    if cls is None:
        name = "Refused" + base.__name__
        cls = _REFUSED[base] = type(name, (RefusedError, base), {"__module__": __name__})
    return cls


def _make(status: int, name: str, message: str, value: Any, kind: Optional[str] = None,
          peer: Optional[str] = None, cause: Optional[str] = None) -> HixlError:
    """Called by the native module: the exception for a Rust error. ``kind`` picks a typed
    subclass (``"peer_lost"``, ``"auth"``...); ``peer`` and ``cause`` are its attributes."""
    base = _BY_STATUS.get(status, HixlError)
    if kind == "refused":
        cls = _refused(base)
    else:
        cls = _KINDS.get(kind or "", base)
    exc = cls(message, status=status, status_name=name, value=value)
    if isinstance(exc, _PeerError):
        exc.peer = peer or ""
        exc.cause = cause or ""
    return exc
