"""Operations in flight: `Op` (awaitable in asyncio, waitable from any thread) and `Transfer`.

An awaited op never runs on the event loop's thread by default: unless it finished already
(a same-host copy done at submission), it is handed to the native runtime, which reports its
end through an eventfd the loop watches. Spinning on the calling thread is opt-in: `Op.spin`
before awaiting, ``HIXL_PY_SPIN_US`` for every await, and ``spin_us`` / ``HIXL_PY_WAIT_SPIN_US``
for the blocking `Op.wait`.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from enum import IntEnum
from typing import Any, Callable, Dict, Generator, Generic, Optional, TypeVar

from . import _hixl

__all__ = ["TransferStatus", "Op", "Transfer", "SPIN_US", "WAIT_SPIN_US"]

T = TypeVar("T")

#: How long an awaited op is driven on the event loop's thread before the loop waits for it
#: (microseconds). 0, the default, never polls an unfinished op there: other coroutines of the
#: loop (an asyncio server's) run while it is in flight. ``HIXL_PY_SPIN_US`` sets it, for a loop
#: that does nothing but await transfers and wants the lowest latency; `Op.spin` opts in for
#: one op.
SPIN_US = int(os.environ.get("HIXL_PY_SPIN_US", "0"))

#: How long ``.wait()`` polls a transfer on the calling thread (which blocks anyway) before the
#: thread parks (microseconds), whether or not it sees progress meanwhile: a same-host copy
#: running on the copy engine's threads then ends with no wake-up. ``HIXL_PY_WAIT_SPIN_US``
#: overrides it; 0 parks at once after the engine's own spin.
WAIT_SPIN_US = int(os.environ.get("HIXL_PY_WAIT_SPIN_US", "2000"))

_WAITING = 0


class TransferStatus(IntEnum):
    """HIXL's ``TransferStatus`` (0–3), plus ``CANCELLED`` (hixl)."""

    WAITING = 0
    COMPLETED = 1
    TIMED_OUT = 2
    FAILED = 3
    CANCELLED = 4


class _LoopBell:
    """One per event loop: the eventfd Rust rings when an op driven for this loop finishes."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.native = _hixl.Waker()
        self.waiting: Dict[int, "asyncio.Future[None]"] = {}
        loop.add_reader(self.native.fileno(), self._ready)

    def _ready(self) -> None:
        for op_id in self.native.drain():
            fut = self.waiting.pop(op_id, None)
            if fut is not None and not fut.done():
                fut.set_result(None)


_bells: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopBell]" = weakref.WeakKeyDictionary()


def _bell(loop: asyncio.AbstractEventLoop) -> _LoopBell:
    b = _bells.get(loop)
    if b is None:
        b = _LoopBell(loop)
        _bells[loop] = b
    return b


def _finished(op: Any) -> bool:
    """Whether the native op has finished, collecting a transfer that finished at submission,
    without polling an unfinished op on this thread (a transfer's poll spins on its link)."""
    if op.done():
        return True
    if op.is_transfer and op.status() != _WAITING:
        # Finished already: `spin` collects it with one poll that returns at once.
        return bool(op.spin(0))
    return False


class Op(Generic[T]):
    """An operation in flight: ``await`` it in asyncio, or ``wait()`` for it from any thread.

    The result is computed once; awaiting or waiting again returns it again (or raises the same
    error). Cancelling the awaiting task cancels the op. Awaiting does not occupy the event
    loop's thread while the op is in flight (see `spin` to opt in to that).
    """

    __slots__ = ("_op", "_wrap", "__weakref__")

    def __init__(self, native: Any, wrap: Optional[Callable[[Any], T]] = None) -> None:
        self._op = native
        self._wrap = wrap

    def _result(self) -> T:
        r = self._op.result()
        return self._wrap(r) if self._wrap is not None else r

    def __await__(self) -> Generator[Any, None, T]:
        op = self._op
        done = op.spin(SPIN_US) if SPIN_US > 0 else _finished(op)
        if not done:
            loop = asyncio.get_running_loop()
            bell = _bell(loop)
            fut = loop.create_future()
            bell.waiting[op.id] = fut
            op.drive(bell.native)
            try:
                yield from fut
            except BaseException:
                bell.waiting.pop(op.id, None)
                op.cancel()
                raise
        return self._result()

    def spin(self, budget_us: int) -> bool:
        """Drives the op on this thread (the GIL released) for up to ``budget_us``
        microseconds, while it makes progress; returns whether it finished. Opt-in spinning:
        ``op.spin(200); await op`` trades this thread's time for latency. On an event loop's
        thread nothing else of the loop runs meanwhile. An op driven already (awaited) is not
        polled here: this then says whether it finished."""
        if isinstance(budget_us, bool) or not isinstance(budget_us, int) or budget_us < 0:
            raise ValueError(f"budget_us must be a non-negative int, not {budget_us!r}")
        return bool(self._op.spin(budget_us))

    def wait(self, timeout: Optional[float] = None, spin_us: Optional[int] = None) -> T:
        """Blocks until the op finishes (the GIL is released) and returns its result or raises
        its error. Past ``timeout`` seconds the op is abandoned and ``HixlTimeoutError``
        raised. ``spin_us`` overrides `WAIT_SPIN_US` for this wait (0: park at once, for a
        caller with many threads waiting at the same time on few cores)."""
        r = self._op.wait(timeout, WAIT_SPIN_US if spin_us is None else int(spin_us))
        return self._wrap(r) if self._wrap is not None else r

    def status(self) -> TransferStatus:
        """The status now, without waiting."""
        return TransferStatus(self._op.status())

    def done(self) -> bool:
        """Whether it finished (in any way)."""
        return bool(self._op.done())

    def cancel(self) -> bool:
        """Cancels it: parts not yet sent are never sent; parts already sent may still land
        until the memory they touch is deregistered (`Engine.deregister` waits for them).
        Returns whether it was unfinished."""
        return bool(self._op.cancel())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.status().name}>"


class Transfer(Op[None]):
    """A posted transfer (HIXL ``TransferReq``)."""

    __slots__ = ()
