"""SIGTERM as a clean exit. Kubernetes, systemd and ``docker stop`` end a process with
SIGTERM, whose default action kills Python without running ``atexit``: the process's engines
would then not close, and a published directory entry would outlive the engine for its whole
TTL. So the first engine made on the main thread turns SIGTERM, while it still has its
default action, into a normal exit (``SystemExit``), which runs ``atexit`` and closes every
engine, as Ctrl-C (SIGINT, ``KeyboardInterrupt``) does.

A host that handles SIGTERM itself (vLLM, SGLang, uvicorn) keeps its handler: its shutdown
ends the interpreter normally, and ``atexit`` closes the engines then. ``HIXL_PY_SIGTERM=0``
leaves SIGTERM alone. As for any Python signal handler, the exit begins when the main thread
next runs Python code (a sleep or a wait is interrupted; a long native call is not).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Optional

_lock = threading.Lock()
_done = False


def _exit_on_sigterm(signum: int, frame: Optional[FrameType]) -> None:
    # A second SIGTERM during the shutdown kills at once, as it would have.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.exit(0)


def exit_cleanly_on_sigterm() -> None:
    """Makes SIGTERM a normal exit if it still has its default action (see the module).
    Called on the main thread it decides once; elsewhere it does nothing (Python lets only
    the main thread set handlers), and a later engine on the main thread decides."""
    global _done
    with _lock:
        if _done or threading.current_thread() is not threading.main_thread():
            return
        _done = True
        if os.environ.get("HIXL_PY_SIGTERM", "1") == "0":
            return
        try:
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _exit_on_sigterm)
        except (ValueError, OSError):
            pass
