"""hixl: one-sided, zero-copy READ/WRITE between processes and machines, for
prefill/decode-disaggregated LLM inference.

``hixl.Engine`` is the engine API (asyncio awaitables, blocking ``.wait()``);
``hixl.llm_datadist`` is a drop-in for HIXL's ``llm_datadist`` package.
"""

from . import _errors
from ._errors import (AlreadyConnectedError, FailedError, HixlError, HixlTimeoutError,
                      NotConnectedError, NotifyFailedError, ParamInvalidError,
                      ResourceExhaustedError, TransferCancelledError, UnsupportedError)
from ._engine import (Access, Engine, Notify, Op, Peer, Region, RemoteRegion, Transfer,
                      TransferOp, TransferStatus)
from ._hixl import __version__

__all__ = [
    "__version__",
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
    *_errors.__all__,
]
