"""The engine SGLang's transfer tier calls, over hixl: the five calls SGLang's Mooncake tier
makes of its engine (session id, batch register/deregister, batch write, probe), each
returning SGLang's convention (0 done, negative failed) and keeping why a session failed.

This file imports neither SGLang nor torch: it is the hixl side only.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .. import _netconf
from .._engine import Engine, Peer, Region
from .._errors import HixlError, PeerLostError, RefusedError, TransferTimeoutError

__all__ = ["HixlTransferEngine", "describe_error", "engine_options", "settings"]

logger = logging.getLogger("hixl.sglang")

#: Environment settings of the backend (SGLang has no per-backend configuration blob): the
#: connectors' network settings (``hixl._netconf.NAMES``) as ``HIXL_SGLANG_<NAME>``, and these.
ENV_PREFIX = "HIXL_SGLANG_"
ENV_TRANSPORT = "HIXL_SGLANG_TRANSPORT"  # auto | tcp | fabric | verbs (hixl.Transport)
ENV_SECRET = "HIXL_SGLANG_SECRET"  # hixl.AuthSecret: links are authenticated
ENV_TIMEOUT = "HIXL_SGLANG_TIMEOUT_S"  # one batch write's bound (default 30 s)
ENV_CONNECT_TIMEOUT = "HIXL_SGLANG_CONNECT_TIMEOUT_S"  # first contact (default 5 s)


def settings(env: Optional[Dict[str, str]] = None,
             ib_device: Optional[str] = None) -> Dict[str, Any]:
    """The network settings from ``HIXL_SGLANG_<NAME>`` (checked; an error names the
    variable's setting). ``ib_device``: SGLang's ``--disaggregation-ib-device`` for this
    rank, the RDMA devices unless ``HIXL_SGLANG_VERBS_DEVICES`` names others."""
    env = dict(os.environ) if env is None else env
    raw = {n: env[ENV_PREFIX + n.upper()].strip() for n in _netconf.NAMES
           if env.get(ENV_PREFIX + n.upper(), "").strip()}
    if ib_device and "verbs_devices" not in raw:
        raw["verbs_devices"] = ib_device
    return _netconf.validate("", raw, lambda n: ENV_PREFIX + n.upper())


def engine_options(env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """hixl option keys from the backend's environment settings."""
    return _netconf.engine_options(settings(env))


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if not v > 0:
        raise ValueError(f"{name}={raw!r} must be positive")
    return v


def describe_error(e: BaseException) -> str:
    """One line naming the cause: peer lost, timeout, refused, or the error as hixl said it."""
    if isinstance(e, TransferTimeoutError):
        return f"timeout: {e}"
    if isinstance(e, PeerLostError):
        return f"peer lost: {e}"
    if isinstance(e, RefusedError):
        return f"refused by the peer: {e}"
    return f"{type(e).__name__}: {e}"


class HixlTransferEngine:
    """One hixl engine per SGLang rank, listening on the settings' address (else ``host``,
    SGLang's) and port (``port`` + ``rank``, else a free one); its session id ``host:port``,
    or with a directory the name it publishes. Thread-safe: SGLang's transfer worker writes
    from several threads at once.
    """

    def __init__(self, host: str, options: Optional[Dict[str, str]] = None, *,
                 net: Optional[Dict[str, Any]] = None, rank: int = 0,
                 role: str = "x") -> None:
        self.timeout = _seconds(ENV_TIMEOUT, 30.0)
        self.connect_timeout = _seconds(ENV_CONNECT_TIMEOUT, 5.0)
        net = settings() if net is None else net
        opts = _netconf.engine_options(net) if options is None else dict(options)
        self.host = _netconf.pick_host(net, host)
        name = ""
        if net.get("directory"):
            base = net.get("name") or f"sglang-{self.host.replace(':', '_')}-{os.getpid()}"
            name = f"{base}-{role}-{rank}"
            opts["hixl.Name"] = name
        where = f"[{self.host}]" if ":" in self.host else self.host
        self.engine = Engine(f"{where}:{_netconf.listen_port(net, rank)}", opts)
        # With a directory, peers reach this rank by its name (resolved to its current
        # address, checked against its incarnation), not by an address.
        self.session_id = name or self.engine.local_engine
        self._lock = threading.Lock()
        self._regions: Dict[int, Region] = {}
        self._peers: Dict[str, Peer] = {}
        self._peer_locks: Dict[str, threading.Lock] = {}
        self._errors: Dict[str, str] = {}
        # bytes that landed through this engine (all sessions)
        self.bytes_written = 0

    def get_session_id(self) -> str:
        return self.session_id

    # memory

    def register(self, ptr: int, length: int) -> None:
        """Registers ``length`` bytes at ``ptr`` (host memory the caller keeps alive until it
        deregisters them)."""
        with self._lock:
            if ptr in self._regions:
                return
        region = self.engine.register_raw(int(ptr), int(length))
        with self._lock:
            self._regions[int(ptr)] = region

    def deregister(self, ptr: int) -> None:
        with self._lock:
            region = self._regions.pop(int(ptr), None)
        if region is not None:
            # waits until no op can touch the region any more
            self.engine.deregister(region).wait()

    def batch_register(self, ptrs: Sequence[int], lengths: Sequence[int]) -> int:
        if len(ptrs) != len(lengths):
            logger.error("hixl: batch_register got %d pointers and %d lengths", len(ptrs),
                         len(lengths))
            return -1
        done: List[int] = []
        for ptr, length in zip(ptrs, lengths):
            try:
                self.register(ptr, length)
            except HixlError as e:
                logger.error("hixl: registering %d bytes at 0x%x failed: %s", length, ptr, e)
                for p in done:
                    self.deregister(p)
                return -1
            done.append(ptr)
        return 0

    def batch_deregister(self, ptrs: Sequence[int]) -> int:
        rc = 0
        for ptr in ptrs:
            try:
                self.deregister(ptr)
            except HixlError as e:
                logger.error("hixl: deregistering 0x%x failed: %s", ptr, e)
                rc = -1
        return rc

    # links

    def _peer(self, session_id: str) -> Peer:
        with self._lock:
            peer = self._peers.get(session_id)
            if peer is not None and peer.is_connected:
                return peer
            plock = self._peer_locks.setdefault(session_id, threading.Lock())
        with plock:
            with self._lock:
                peer = self._peers.get(session_id)
            if peer is not None and peer.is_connected:
                return peer
            if peer is not None:
                try:  # a lost link: drop it before linking again
                    self.engine.disconnect(session_id).wait(self.connect_timeout)
                except HixlError:
                    pass
            if ":" in session_id:
                _netconf.check_peer_address(self.host, session_id.rpartition(":")[0].strip("[]"),
                                            f"decode rank {session_id}")
            peer = self.engine.connect(session_id, self.connect_timeout).wait()
            with self._lock:
                self._peers[session_id] = peer
            return peer

    def forget(self, session_id: str) -> None:
        """Drops the link to ``session_id``: its ops in flight fail."""
        with self._lock:
            peer = self._peers.pop(session_id, None)
        if peer is not None:
            try:
                self.engine.disconnect(session_id).wait(self.connect_timeout)
            except HixlError:
                pass

    def last_error(self, session_id: str) -> Optional[str]:
        """Why the last failed call to ``session_id`` failed (None if none did)."""
        with self._lock:
            return self._errors.get(session_id)

    def _failed(self, session_id: str, what: str, e: BaseException) -> int:
        why = f"{what} to {session_id}: {describe_error(e)}"
        with self._lock:
            self._errors[session_id] = why
        logger.warning("hixl: %s", why)
        return -1

    # transfers

    def batch_transfer_sync(self, session_id: str, buffers: Sequence[int],
                            peer_buffer_addresses: Sequence[int],
                            lengths: Sequence[int]) -> int:
        """WRITEs each ``lengths[i]`` bytes at ``buffers[i]`` to ``peer_buffer_addresses[i]``
        of ``session_id``, as one hixl op; returns 0 once every byte landed, -1 otherwise."""
        n = len(buffers)
        if n == 0:
            return 0
        if len(peer_buffer_addresses) != n or len(lengths) != n:
            return self._failed(session_id, "a batch write", ValueError(
                f"{n} local addresses, {len(peer_buffer_addresses)} remote, "
                f"{len(lengths)} lengths"))
        descs = np.empty((n, 3), dtype=np.uint64)
        descs[:, 0] = buffers
        descs[:, 1] = peer_buffer_addresses
        descs[:, 2] = lengths
        return self.write_descs(session_id, descs)

    def write_descs(self, session_id: str, descs: np.ndarray) -> int:
        """WRITEs an N×3 ``uint64`` array of ``(local, remote, len)`` as one op."""
        try:
            peer = self._peer(session_id)
            # SGLang's transfer worker waits from several threads at once (one per layer):
            # they park rather than spin, or they take the cores the transfers need
            peer.write(descs, self.timeout).wait(spin_us=0)
        except (HixlError, OSError, ValueError) as e:
            if isinstance(e, (PeerLostError, TransferTimeoutError)):
                self.forget(session_id)
            return self._failed(session_id, f"a write of {len(descs)} pieces", e)
        with self._lock:
            self.bytes_written += int(descs[:, 2].sum())
            # the session works again: an older failure is not this one's cause
            self._errors.pop(session_id, None)
        return 0

    def transfer_sync(self, session_id: str, buffer: int, peer_buffer_address: int,
                      length: int) -> int:
        return self.batch_transfer_sync(session_id, [buffer], [peer_buffer_address], [length])

    def send_probe(self, session_id: str) -> int:
        """0 if ``session_id`` can be linked (or is), -1 otherwise."""
        try:
            self._peer(session_id)
        except (HixlError, ValueError) as e:
            return self._failed(session_id, "a probe", e)
        return 0

    def close(self) -> None:
        self.engine.close()

