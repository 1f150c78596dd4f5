"""What the parts of ``CacheManager`` share: the native handle, the finalized check, cache
ownership, and the argument helpers (tensor addresses, layer ranges)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from .. import _hixl
from ._status import LLMException, LLMStatusCode, _type_error, _value_error
from ._types import Cache, _int, _layer_range, _U32

_S = LLMStatusCode


class _Manager:
    """The state every part of :class:`CacheManager` works on."""

    def __init__(self, native: _hixl.DataDist) -> None:
        self._native = native
        self._valid = True

    def _check(self) -> None:
        if not self._valid:
            raise LLMException("this CacheManager's LLMDataDist was finalized; take "
                               "cache_manager again after init", _S.LLM_ENGINE_FINALIZED)

    def _registered(self, name: str, cache: Any) -> Cache:
        if not isinstance(cache, Cache):
            raise _type_error(f"{name} must be a Cache, got {cache!r}")
        if cache._owner is not self._native:
            raise LLMException(f"{name} (cache {cache.cache_id}) is not registered with this "
                               "LLMDataDist", _S.LLM_KV_CACHE_NOT_EXIST)
        return cache


def _address(i: int, a: Any, size: int) -> int:
    """The address of tensor ``i``: an int, or (hixl extension) a host array the cache then
    keeps alive: a numpy array (``__array_interface__``) or a CPU torch tensor
    (``data_ptr()``), C-contiguous, writable and at least ``size`` bytes."""
    if isinstance(a, int) and not isinstance(a, bool):
        return _int(f"addrs[{i}]", a)
    ai = getattr(a, "__array_interface__", None)
    if isinstance(ai, dict):
        ptr, readonly = ai["data"]
        flags = getattr(a, "flags", None)
        contiguous = bool(flags["C_CONTIGUOUS"]) if flags is not None else ai.get("strides") is None
        nbytes = int(getattr(a, "nbytes", 0))
        if readonly:
            raise _value_error(f"addrs[{i}] is a read-only array; peers write cache memory")
    elif callable(getattr(a, "data_ptr", None)):
        device = str(getattr(a, "device", "cpu"))
        if device != "cpu":
            raise LLMException(f"addrs[{i}] is a tensor on {device}: device memory needs a "
                               "device runtime, which this build of hixl does not have",
                               _S.LLM_FEATURE_NOT_ENABLED)
        ptr = a.data_ptr()
        contiguous = bool(a.is_contiguous())
        nbytes = int(a.numel()) * int(a.element_size())
    else:
        raise _type_error(f"addrs[{i}] must be an int address (or a host array), got "
                          f"{type(a).__name__}")
    if not contiguous:
        raise _value_error(f"addrs[{i}] is not C-contiguous")
    if nbytes < size:
        raise _value_error(f"addrs[{i}] holds {nbytes} bytes; the cache descriptor needs "
                           f"{size} per tensor")
    return int(ptr)


def _ext(src_layer_range: Optional[range], dst_layer_range: Optional[range],
         tensor_num_per_layer: int) -> Tuple[Any, Any, int]:
    return (_layer_range("src_layer_range", src_layer_range),
            _layer_range("dst_layer_range", dst_layer_range),
            _int("tensor_num_per_layer", tensor_num_per_layer, 1, _U32))


def _kw(what: str, kwargs: Dict[str, Any]) -> Tuple[Any, Any, int]:
    allowed = {"src_layer_range", "dst_layer_range", "tensor_num_per_layer"}
    bad = sorted(set(kwargs) - allowed)
    if bad:
        raise _type_error(f"{what}() got unexpected keyword arguments {bad}; it takes "
                          f"{sorted(allowed)}")
    return _ext(kwargs.get("src_layer_range"), kwargs.get("dst_layer_range"),
                kwargs.get("tensor_num_per_layer", 2))
