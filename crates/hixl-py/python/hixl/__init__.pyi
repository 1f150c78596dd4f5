"""hixl: one-sided, zero-copy READ/WRITE between processes and machines."""

from ._engine import Access as Access
from ._engine import Engine as Engine
from ._engine import Notify as Notify
from ._engine import Op as Op
from ._engine import Peer as Peer
from ._engine import Region as Region
from ._engine import RemoteRegion as RemoteRegion
from ._engine import Transfer as Transfer
from ._engine import TransferOp as TransferOp
from ._engine import TransferStatus as TransferStatus
from ._errors import AlreadyConnectedError as AlreadyConnectedError
from ._errors import AuthError as AuthError
from ._errors import FailedError as FailedError
from ._errors import HeartbeatLostError as HeartbeatLostError
from ._errors import HixlError as HixlError
from ._errors import HixlTimeoutError as HixlTimeoutError
from ._errors import NotConnectedError as NotConnectedError
from ._errors import NotifyFailedError as NotifyFailedError
from ._errors import ParamInvalidError as ParamInvalidError
from ._errors import PeerLostError as PeerLostError
from ._errors import RefusedError as RefusedError
from ._errors import ResourceExhaustedError as ResourceExhaustedError
from ._errors import TransferCancelledError as TransferCancelledError
from ._errors import TransferTimeoutError as TransferTimeoutError
from ._errors import UnsupportedError as UnsupportedError
from ._xfer_descs import xfer_descs as xfer_descs

__version__: str
#: The engine-to-engine protocol's version: engines of different versions refuse to link.
WIRE_VERSION: int

def reset_log_cache() -> None: ...
