"""The engine API: `Engine`, `Peer`, `Region` (the awaitable `Op`s are in `_ops`)."""

from __future__ import annotations

import asyncio
import atexit
import json
import threading
import weakref
from enum import IntEnum, IntFlag
from typing import Any, AsyncIterator, Dict, List, NamedTuple, Optional, Set, Tuple, Union

from . import _hixl
from ._connect import check_retries
from ._directory import DirectoryMixin
from ._offloop import run_off_loop
from ._ops import Op, Transfer, TransferStatus
from ._signals import exit_cleanly_on_sigterm
from ._spans import Descs, _array_ptr, _buffer_span
from ._views import ViewState, buffer, numpy

__all__ = [
    "Access",
    "TransferOp",
    "TransferStatus",
    "RemoteRegion",
    "Notify",
    "Op",
    "Transfer",
    "Region",
    "Peer",
    "Engine",
]


class Access(IntFlag):
    """What peers may do with a region."""

    LOCAL = 0
    REMOTE_READ = 1
    REMOTE_WRITE = 2
    REMOTE_RW = 3


class TransferOp(IntEnum):
    """HIXL's ``TransferOp``."""

    READ = 0
    WRITE = 1


class RemoteRegion(NamedTuple):
    """A region a peer registered: use ``addr`` (+ offsets) as the remote address."""

    addr: int
    len: int
    rkey: int
    access: Access
    name: Optional[str]


class Notify(NamedTuple):
    """A received notify."""

    sender: str
    """The sender's engine address."""
    link: int
    """The receiving engine's id of the sender's connection."""
    name: bytes
    msg: bytes


class Region:
    """A registered region of this process's memory."""

    __slots__ = ("_native", "_keep", "_engine", "_views", "name", "__weakref__")

    def __init__(self, native: Any, keep: Any, engine: "Engine", name: Optional[str],
                 pooled: bool = False) -> None:
        self._native = native
        self._keep = keep
        self._engine = engine
        self._views: Optional[ViewState] = ViewState() if pooled else None
        self.name = name

    @property
    def addr(self) -> int:
        """Start address (use ``addr + offset`` in descriptors)."""
        return int(self._native.addr)

    @property
    def len(self) -> int:
        """Length in bytes."""
        return int(self._native.len)

    def __len__(self) -> int:
        return self.len

    @property
    def access(self) -> Access:
        return Access(self._native.access)

    @property
    def obj(self) -> Any:
        """The registered Python object (None for `register_raw` without keepalive)."""
        k = self._keep
        return k[0] if isinstance(k, tuple) else k

    def read(self, offset: int, length: int) -> bytes:
        """Copies bytes out (bounds-checked)."""
        return bytes(self._native.read(offset, length))

    def buffer(self, offset: int = 0, length: Optional[int] = None) -> memoryview:
        """A pooled region's bytes in place: a writable ``memoryview`` (format ``B``) of
        ``offset .. offset + length`` (to the end by default). The view keeps the memory
        mapped (after `Engine.close` too) until released; `Engine.deregister` refuses the
        region meanwhile (``BufferError``). Other regions raise ``ParamInvalidError``."""
        return buffer(self, offset, length)

    def numpy(self, dtype: Any = "uint8", shape: Union[None, int, Tuple[int, ...]] = None,
              offset: int = 0) -> Any:
        """A pooled region as a writable ``numpy.ndarray`` of ``dtype`` (and ``shape``; 1-D
        over the rest of the region by default) from byte ``offset``; a view as `buffer`."""
        return numpy(self, dtype, shape, offset)

    def write(self, offset: int, data: bytes) -> None:
        """Copies bytes in (bounds-checked)."""
        self._native.write(offset, bytes(data))

    def deregister(self) -> Op[None]:
        """`Engine.deregister` of this region."""
        return self._engine.deregister(self)

    def __repr__(self) -> str:
        return f"<Region {self.addr:#x}+{self.len} {self.name or ''}>"


# --- peers and engines -----------------------------------------------------------------------


class Peer:
    """A link to another engine."""

    __slots__ = ("_native",)

    def __init__(self, native: Any) -> None:
        self._native = native

    @property
    def name(self) -> str:
        return str(self._native.name)

    @property
    def transport(self) -> str:
        """How the link moves bytes (``fabric (...)``, ``tcp (...)``, ``verbs (...)``)."""
        return str(self._native.transport)

    @property
    def is_connected(self) -> bool:
        return bool(self._native.is_connected)

    @property
    def incarnation(self) -> int:
        """The peer's incarnation (its directory entry shows it as 16 hex digits)."""
        return int(self._native.incarnation)

    @property
    def regions(self) -> List[RemoteRegion]:
        """The peer's registered regions."""
        return [RemoteRegion(a, n, k, Access(acc), nm) for a, n, k, acc, nm in self._native.regions()]

    def region(self, name: str) -> RemoteRegion:
        """The peer's region registered as ``name`` (raises KeyError naming those it has)."""
        regions = self.regions
        for r in regions:
            if r.name == name:
                return r
        names = sorted(repr(r.name) for r in regions if r.name is not None)
        raise KeyError(f"the peer has no region named {name!r}; its named regions: "
                       f"{', '.join(names) if names else 'none'}")

    def transfer(self, op: Union[TransferOp, int], descs: Descs,
                 timeout: Optional[float] = None) -> Transfer:
        """Posts a transfer: ``descs`` is a list of ``(local_addr, remote_addr, len)`` or an
        N×3 ``uint64`` array (the fast path). ``timeout`` in seconds bounds it (the op is then
        abandoned, status ``TIMED_OUT``)."""
        if type(descs) is not list:
            arr = _array_ptr(descs, 3)
            if arr is not None:
                ptr, n, _owner = arr
                return Transfer(self._native.transfer_array(int(op), ptr, n, timeout))
        return Transfer(self._native.transfer(int(op), descs, timeout))

    def read(self, descs: Descs, timeout: Optional[float] = None) -> Transfer:
        """READ: remote → local (see `transfer`)."""
        if type(descs) is list:
            return Transfer(self._native.transfer(0, descs, timeout))
        return self.transfer(TransferOp.READ, descs, timeout)

    def write(self, descs: Descs, timeout: Optional[float] = None) -> Transfer:
        """WRITE: local → remote (see `transfer`)."""
        if type(descs) is list:
            return Transfer(self._native.transfer(1, descs, timeout))
        return self.transfer(TransferOp.WRITE, descs, timeout)

    def transfer_strided(self, op: Union[TransferOp, int], descs: Any,
                         timeout: Optional[float] = None) -> Transfer:
        """Posts strided descriptors ``(local, remote, len, local_stride, remote_stride, count)``
        (a list of tuples or an N×6 ``uint64`` array): each moves ``count`` pieces of ``len``
        bytes as one request on the wire."""
        arr = _array_ptr(descs, 6)
        if arr is not None:
            ptr, n, _owner = arr
            return Transfer(self._native.transfer_strided_array(int(op), ptr, n, timeout))
        return Transfer(self._native.transfer_strided(int(op), descs, timeout))

    def notify(self, name: Union[str, bytes], msg: Union[str, bytes],
               timeout: float = 1.0) -> Op[None]:
        """Sends a notify (name and message up to 1024 bytes each)."""
        n = name.encode() if isinstance(name, str) else bytes(name)
        m = msg.encode() if isinstance(msg, str) else bytes(msg)
        return Op(self._native.notify(n, m, timeout))

    def __repr__(self) -> str:
        return f"<Peer {self.name} {self.transport}>"


def _notify(t: Tuple[str, int, bytes, bytes]) -> Notify:
    return Notify(*t)


class _Notifications:
    def __init__(self, native: Any) -> None:
        self._native = native

    def __aiter__(self) -> "_Notifications":
        return self

    async def __anext__(self) -> Notify:
        return await Op(self._native.next(), _notify)


_engines: "weakref.WeakSet[Engine]" = weakref.WeakSet()


def _close_native(native: Any) -> None:
    try:
        native.close(0.2)
    except Exception:  # noqa: BLE001 - closing on the way out
        pass
_engines_lock = threading.Lock()


class Engine(DirectoryMixin):
    """A hixl engine (HIXL ``Hixl``): registers memory, links to peers, moves bytes.

    ``local_engine`` is ``"ip"`` (initiator only), ``"ip:port"`` (also accepts links) or
    ``"ip:0"`` (a free port; see ``local_engine`` afterwards). ``options`` are HIXL option
    keys with string values (``"hixl.Transport": "fabric"``...); unknown keys are refused.
    """

    def __init__(self, local_engine: str, options: Optional[Dict[str, str]] = None) -> None:
        pairs = [(str(k), str(v)) for k, v in (options or {}).items()]
        self._native = _hixl.Engine(local_engine, pairs)
        # Held until deregistered or closed, not weakly: a Region the caller drops stays
        # registered (peers may still write into it), so the object it keeps alive must too.
        self._regions: Set[Region] = set()
        with _engines_lock:
            _engines.add(self)
        # An engine dropped without close() (its owner's frame unwound by SystemExit, say)
        # is closed as it goes: links closed, a published directory entry withdrawn.
        weakref.finalize(self, _close_native, self._native)
        exit_cleanly_on_sigterm()

    @property
    def local_engine(self) -> str:
        """This engine's address, as peers connect to it."""
        return self._native.local_engine

    @property
    def closed(self) -> bool:
        return self._native.closed

    def info(self) -> Dict[str, Any]:
        """Transport facts: listen address, the TCP I/O path and why, AutoConnect, and the
        RDMA device verbs uses (``verbs_device``) or why verbs is off (``verbs_reason``: the
        ``hixl.Transport`` option, no active device, or no libibverbs on this host)."""
        return self._native.info()

    def metrics_text(self) -> str:
        """This engine's telemetry in the Prometheus text format: per peer, transport and
        operation, transfers ended by outcome, bytes, descriptors, submission time and a
        duration histogram (post → end seen); the links up and the initiators connected."""
        return self._native.metrics_text()

    def serve_metrics(self, listen: str) -> "_hixl.MetricsServer":
        """Serves :meth:`metrics_text` as Prometheus text at ``GET /metrics`` on ``listen``
        (``ip:port``; port 0 picks one) until the returned server is closed or dropped; its
        ``local_addr`` is where it listens."""
        return _hixl.serve_metrics(self._native, listen)

    def doctor(self, peer: str, *, expect: Optional[str] = None, probe: bool = True,
               size: int = 8 << 20, block: int = 1 << 20,
               duration: float = 0.5) -> Dict[str, Any]:
        """A preflight of the path from this engine to ``peer`` (``ip:port``, or a name when
        this engine has ``hixl.Directory``): the report of ``hixl doctor --peer PEER --json``,
        ``{"ok": bool, "facts": {...}, "findings": [{"severity", "code", "what"}...]}``.
        ``ok`` is false when a finding is an error. ``expect`` names the transport the peer
        should get (``tcp``, ``fabric``, ``verbs``); ``probe`` runs hixl WRITEs of ``size``
        bytes (``block`` per descriptor) into the peer's writable region for ``duration``
        seconds a round, against raw TCP when the peer runs ``hixl doctor --serve``.

        Blocks (seconds, with the probe) with the GIL released; from a coroutine, run it with
        ``await asyncio.to_thread(engine.doctor, peer)``. Bad arguments raise hixl's
        PARAM_INVALID error naming the value; a peer that cannot be reached is a finding."""
        return dict(json.loads(_hixl.doctor(self._native, peer, expect, probe, size, block,
                                            duration)))

    def take_transfer_records(self) -> List[Dict[str, Any]]:
        """The transfers that ended since the last call (the last 1024 per link at most), each
        a dict: ``peer``, ``transport``, ``op`` (``"read"``/``"write"``), ``bytes``,
        ``descriptors``, ``post_s`` (submission time), ``duration_s`` (post → end seen),
        ``outcome`` (``completed``, ``failed``, ``timed_out``, ``abandoned``)."""
        keys = ("peer", "transport", "op", "bytes", "descriptors", "post_s", "duration_s",
                "outcome")
        return [dict(zip(keys, r)) for r in self._native.take_transfer_records()]

    # memory

    def register(self, obj: Any, access: Access = Access.REMOTE_RW,
                 name: Optional[str] = None) -> Region:
        """Registers a writable, contiguous buffer: bytearray, memoryview, ``numpy.ndarray``,
        anything with the buffer protocol, or a CPU tensor through ``__dlpack__`` (torch is
        never imported). The region keeps ``obj`` alive (and unresizable) until deregistered."""
        addr, nbytes, keep = _buffer_span(obj)
        native = self._native.register_raw(addr, nbytes, int(access), name)
        r = Region(native, keep, self, name)
        self._regions.add(r)
        return r

    def register_raw(self, addr: int, length: int, access: Access = Access.REMOTE_RW,
                     name: Optional[str] = None, keepalive: Any = None) -> Region:
        """Registers ``length`` bytes at ``addr``: memory you keep valid until deregistered
        (``keepalive`` is held by the region meanwhile)."""
        native = self._native.register_raw(int(addr), int(length), int(access), name)
        r = Region(native, keepalive, self, name)
        self._regions.add(r)
        return r

    def register_pooled(self, length: int, access: Access = Access.REMOTE_RW,
                        name: Optional[str] = None) -> Region:
        """Allocates and registers ``length`` bytes of the engine's shared-memory pool (peers
        on this host map it directly). Reach it in place with `Region.buffer` /
        `Region.numpy`, or copy with `Region.read` / `Region.write`."""
        native = self._native.register_pooled(int(length), int(access), name)
        r = Region(native, None, self, name, pooled=True)
        self._regions.add(r)
        return r

    def deregister(self, region: Region) -> Op[None]:
        """Deregisters: the op finishes once no op can touch the region any more; then the
        registered object is released. A pooled region with live views (`Region.buffer`)
        raises ``BufferError`` instead."""
        if region._views is not None:
            region._views.start_deregistering(region)
        try:
            inner: Op[None] = Op(self._native.deregister(region._native))
        except BaseException:
            if region._views is not None:
                region._views.closing = False
            raise

        def release(_: Any) -> None:
            region._native._forget()
            region._keep = None
            self._regions.discard(region)

        return Op(inner._op, release)

    # links

    def connect(self, remote: str, timeout: float = 3.0, retries: int = 0,
                backoff: float = 0.1) -> Op[Peer]:
        """Links to ``remote`` (``ip:port``); the op yields the `Peer`. ``timeout`` bounds each
        try. With ``retries``, a try the peer refuses or that cannot reach it (nothing
        listens yet, host or network unreachable, reset, timed out) is made again up to
        ``retries`` times, ``backoff`` seconds after the first failure, doubling (at most
        10 s); other errors (authentication, wire version, a bad address) end it at once.
        After the last try the error is the last one's class, its message saying how many
        tries were made. Each retry is logged (INFO, logger ``hixl.hixl_py.connect``)."""
        if check_retries(retries, backoff):
            return Op(self._native.connect_retrying(remote, timeout, retries, float(backoff)),
                      Peer)
        return Op(self._native.connect(remote, timeout), Peer)

    def connect_named(self, name: str, timeout: float = 3.0) -> Op[Peer]:
        """Links to the engine published as ``name`` in ``hixl.Directory``; yields the `Peer`."""
        return Op(self._native.connect_named(name, timeout), Peer)

    def disconnect(self, remote: str) -> Op[None]:
        """Closes the link to ``remote``; its ops in flight fail."""
        return Op(self._native.disconnect(remote))

    def peer(self, remote: str) -> Peer:
        """The link to ``remote`` (raises NotConnectedError)."""
        return Peer(self._native.peer(remote))

    def peers(self) -> List[str]:
        return list(self._native.peers())

    def transfer(self, remote: str, op: Union[TransferOp, int], descs: Descs,
                 timeout: Optional[float] = None) -> Transfer:
        """A transfer to ``remote`` by name (HIXL ``TransferAsync``; descriptors as for
        `Peer.transfer`); with AutoConnect on, the link is made first."""
        if type(descs) is not list:
            arr = _array_ptr(descs, 3)
            if arr is not None:
                ptr, n, _owner = arr
                return Transfer(self._native.transfer_array(remote, int(op), ptr, n, timeout))
            descs = list(descs)
        return Transfer(self._native.transfer(remote, int(op), descs, timeout))

    # notifies

    def notifications(self) -> AsyncIterator[Notify]:
        """``async for n in engine.notifications()``: notifies as they arrive (ends when the
        engine closes)."""
        return _Notifications(self._native.notifications())

    def take_notifies(self) -> List[Notify]:
        """Returns and clears the notifies received so far (HIXL ``GetNotifies``)."""
        return [Notify(*t) for t in self._native.take_notifies()]

    @property
    def ops_in_flight(self) -> int:
        return self._native.ops_in_flight()

    # lifecycle

    def close(self, grace: float = 1.0) -> None:
        """Closes links and the listener (in-flight ops fail), waits up to ``grace`` seconds
        for them, and releases registered objects. Idempotent; also run at interpreter exit."""
        self._native.close(grace)
        for r in list(self._regions):
            r._native._forget()
            r._keep = None
        self._regions.clear()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> "Engine":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self, grace: float = 1.0) -> None:
        """`close` for asyncio: the blocking close runs on a thread of its own while the event
        loop runs on (ops awaited on it fail as their links close, other coroutines keep
        running). ``async with Engine(...)`` ends with it. Cancelling the await does not
        stop the close."""
        await run_off_loop("hixl-aclose", self.close, grace)

    def __repr__(self) -> str:
        return f"<Engine {self.local_engine}{' closed' if self.closed else ''}>"


@atexit.register
def _close_all() -> None:
    with _engines_lock:
        engines = list(_engines)
    for e in engines:
        try:
            e.close(0.2)
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
