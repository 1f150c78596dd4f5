"""hixl: one-sided, zero-copy READ/WRITE between processes and machines."""

from ._errors import *  # noqa: F401,F403
from ._hixl import __version__  # noqa: F401
