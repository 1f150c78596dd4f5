"""hixl: one-sided, zero-copy READ/WRITE between processes and machines, for
prefill/decode-disaggregated LLM inference.

``hixl.Engine`` is the engine API (asyncio awaitables, blocking ``.wait()``);
``hixl.xfer_descs`` builds descriptor arrays from regions, offsets and lengths;
``hixl.llm_datadist`` is a drop-in for HIXL's ``llm_datadist`` package.

The native code logs through Python's ``logging``, to loggers under ``hixl`` (e.g.
``hixl.hixl_async.server``); a level set on one after it first logged takes effect after
``hixl.reset_log_cache()``.
"""

import atexit as _atexit

from ._hixl import _stop_logging

# Registered before any other hook of the package, so it runs last at exit (after engines
# closed and logged it): the native logging thread ends before Python finalizes.
_atexit.register(_stop_logging)

from . import _errors  # noqa: E402
from ._errors import (AlreadyConnectedError, AuthError, FailedError, HeartbeatLostError,
                      HixlError, HixlTimeoutError, NotConnectedError, NotifyFailedError,
                      ParamInvalidError, PeerLostError, RefusedError, ResourceExhaustedError,
                      TransferCancelledError, TransferTimeoutError, UnsupportedError)
from ._engine import (Access, Engine, Notify, Op, Peer, Region, RemoteRegion, Transfer,
                      TransferOp, TransferStatus)
from ._hixl import WIRE_VERSION, __version__
from ._hixl import _reset_log_cache as reset_log_cache
from ._xfer_descs import xfer_descs

__all__ = [
    "__version__",
    "WIRE_VERSION",
    "Engine",
    "Peer",
    "Region",
    "RemoteRegion",
    "Op",
    "Transfer",
    "TransferOp",
    "TransferStatus",
    "Access",
    "Notify",
    "xfer_descs",
    "reset_log_cache",
    *_errors.__all__,
]
