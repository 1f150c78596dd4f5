"""LLM-DataDist status codes and the exception every failing call raises."""

from __future__ import annotations

import enum
from typing import Iterable, List, NamedTuple, Optional, Tuple

__all__ = ["LLMStatusCode", "LLMException", "BlockFailure"]

_BASE = 0x5010B000


class LLMStatusCode(enum.IntEnum):
    """Status codes of LLM-DataDist (``LLMException.status_code``), with LLM-DataDist's values
    (``ge::Status``: ``0x5010B000 + n``).

    ``LLM_LEASE_ENDED`` and ``LLM_LEASE_HELD`` are hixl extensions (request-scoped leases).
    """

    LLM_SUCCESS = 0
    LLM_WAIT_PROC_TIMEOUT = _BASE + 1
    LLM_WAIT_PROCESS_TIMEOUT = _BASE + 1  # the spelling older releases use
    LLM_KV_CACHE_NOT_EXIST = _BASE + 2
    LLM_REPEAT_REQUEST = _BASE + 3
    LLM_REQUEST_ALREADY_COMPLETED = _BASE + 4
    LLM_PARAM_INVALID = _BASE + 5
    LLM_ENGINE_FINALIZED = _BASE + 6
    LLM_NOT_YET_LINK = _BASE + 7
    LLM_ALREADY_LINK = _BASE + 8
    LLM_LINK_FAILED = _BASE + 9
    LLM_UNLINK_FAILED = _BASE + 10
    LLM_NOTIFY_PROMPT_UNLINK_FAILED = _BASE + 11
    LLM_CLUSTER_NUM_EXCEED_LIMIT = _BASE + 12
    LLM_PROCESSING_LINK = _BASE + 13
    LLM_DEVICE_OUT_OF_MEMORY = _BASE + 14
    LLM_PREFIX_ALREADY_EXIST = _BASE + 15
    LLM_PREFIX_NOT_EXIST = _BASE + 16
    LLM_SEQ_LEN_OVER_LIMIT = _BASE + 17
    LLM_NO_FREE_BLOCK = _BASE + 18
    LLM_BLOCKS_OUT_OF_MEMORY = _BASE + 19
    LLM_CACHE_INCOMPATIBLE = _BASE + 20
    LLM_CACHE_KEY_ALREADY_EXIST = _BASE + 21
    LLM_COPY_CACHE_FAILED = _BASE + 22
    LLM_CACHE_ID_ALREADY_EXIST = _BASE + 23
    LLM_EXIST_LINK = _BASE + 24
    LLM_FEATURE_NOT_ENABLED = _BASE + 25
    LLM_TIMEOUT = _BASE + 26
    LLM_LINK_BUSY = _BASE + 27
    LLM_OUT_OF_MEMORY = _BASE + 28
    # Device-memory fault codes of the real package; hixl (host memory only) never returns
    # them. Their values here are hixl's, outside LLM-DataDist's range.
    LLM_DEVICE_MEM_ERROR = _BASE + 0xF01
    LLM_SUSPECT_REMOTE_ERROR = _BASE + 0xF02
    # hixl extensions.
    LLM_LEASE_ENDED = 0x5010B100
    LLM_LEASE_HELD = 0x5010B101
    LLM_FAILED = 0xFFFFFFFF
    LLM_UNKNOWN_ERROR = -1

    def __str__(self) -> str:
        return f"{self.__class__.__name__}.{self.name}"


def _code(value: int) -> LLMStatusCode:
    try:
        return LLMStatusCode(value)
    except ValueError:
        return LLMStatusCode.LLM_UNKNOWN_ERROR


class BlockFailure(NamedTuple):
    """One (layer, block) pair of a block transfer that did not land (hixl extension)."""

    src_layer: int
    dst_layer: int
    src_block: int
    dst_block: int


class LLMException(RuntimeError):
    """The exception every LLM-DataDist call raises on failure.

    Attributes:
        status_code: the :class:`LLMStatusCode`.
        failed_blocks: hixl extension. For a block transfer (``pull_blocks``, ``push_blocks``,
            ``pull_cache``, ``push_cache``, leased and resharded pulls, layer-wise pushes) that
            failed part-way: every ``(src_layer, dst_layer, src_block, dst_block)`` pair that did
            not land, as :class:`BlockFailure` tuples, sorted. Every pair of the call not listed
            landed completely. Empty when nothing moved (or the call moves no blocks).
    """

    def __init__(self, message: str, status_code: LLMStatusCode = LLMStatusCode.LLM_FAILED,
                 failed_blocks: Iterable[Tuple[int, int, int, int]] = ()) -> None:
        super().__init__(message)
        self._status_code = _code(int(status_code))
        self.failed_blocks: List[BlockFailure] = [BlockFailure(*f) for f in failed_blocks]

    @property
    def status_code(self) -> LLMStatusCode:
        """The error's :class:`LLMStatusCode`."""
        return self._status_code

    def __str__(self) -> str:
        return f"{self.args[0]} [{self._status_code.name}]"


class LLMParamTypeError(LLMException, TypeError):
    """An argument of the wrong type (``LLM_PARAM_INVALID``; also a ``TypeError``)."""


class LLMParamValueError(LLMException, ValueError):
    """An argument with a bad value (``LLM_PARAM_INVALID``; also a ``ValueError``)."""


def _type_error(message: str) -> LLMException:
    return LLMParamTypeError(message, LLMStatusCode.LLM_PARAM_INVALID)


def _value_error(message: str) -> LLMException:
    return LLMParamValueError(message, LLMStatusCode.LLM_PARAM_INVALID)


def _native_error(code: int, message: str,
                  failed: List[Tuple[int, int, int, int]]) -> LLMException:
    """Called by the native module: the exception for a Rust error."""
    status = _code(code)
    if status == LLMStatusCode.LLM_PARAM_INVALID and not failed:
        return LLMParamValueError(message, status)
    return LLMException(message, status, failed)


def _check_native_codes(codes: Optional[List[Tuple[str, int]]]) -> None:
    """Checks that every code the Rust layer returns has the same name and value here."""
    for name, value in codes or ():
        assert LLMStatusCode[name] == value, (name, value)
