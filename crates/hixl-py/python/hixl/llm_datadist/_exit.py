"""Every initialized ``LLMDataDist`` is finalized when the interpreter exits (its links closed,
its engine stopped, a published directory entry withdrawn), and SIGTERM becomes such an exit
where it still has its default action (see ``hixl._signals``)."""

from __future__ import annotations

import atexit
import threading
import weakref
from typing import Any

from .._signals import exit_cleanly_on_sigterm

_live: "weakref.WeakSet[Any]" = weakref.WeakSet()
_lock = threading.Lock()


def track(dd: Any) -> None:
    """Finalizes ``dd`` at exit unless it was finalized before."""
    with _lock:
        _live.add(dd)
    exit_cleanly_on_sigterm()


@atexit.register
def _finalize_all() -> None:
    with _lock:
        live = list(_live)
    for dd in live:
        try:
            dd.finalize()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
