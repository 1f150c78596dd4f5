"""`Engine.connect`'s retry arguments, checked before anything is tried (the native side
tries, waits and logs: ``hixl._hixl.Engine.connect_retrying``)."""

from __future__ import annotations

import math
from typing import Any

from ._errors import ParamInvalidError

#: The most retries one connect makes (the wait between two is at most 10 s).
MAX_RETRIES = 1_000_000


def check_retries(retries: Any, backoff: Any) -> bool:
    """Whether a connect with these arguments retries; ``TypeError`` or ``ParamInvalidError``
    (a ``ValueError``) naming a bad one."""
    if isinstance(retries, bool) or not isinstance(retries, int):
        raise TypeError(f"retries must be an int, not {type(retries).__name__} ({retries!r})")
    if not 0 <= retries <= MAX_RETRIES:
        raise ParamInvalidError(f"retries {retries}: expected 0 to {MAX_RETRIES}", value=retries)
    if isinstance(backoff, bool) or not isinstance(backoff, (int, float)):
        raise TypeError(f"backoff must be a number of seconds, not {type(backoff).__name__} "
                        f"({backoff!r})")
    if not (math.isfinite(backoff) and backoff >= 0):
        raise ParamInvalidError(f"backoff {backoff!r}: expected a finite number of seconds >= 0",
                                value=backoff)
    return retries > 0
