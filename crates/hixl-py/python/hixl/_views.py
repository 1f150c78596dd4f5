"""Buffer and numpy views of pooled regions (`Engine.register_pooled`): the engine owns their
memory, so a view is the way to touch it in place (no copy, unlike `Region.read`).

A view can never outlive the memory it shows. Each holds a native ``Mapping`` of the region,
which keeps the memory mapped after the engine closes. Deregistering frees the memory whoever
holds it, so `Engine.deregister` refuses a region while views of it live (``BufferError``, as
``bytearray`` refuses to resize while exported), and a region being deregistered (or of a
closed engine) gives no new view.
"""

from __future__ import annotations

import ctypes
import operator
import threading
import weakref
from typing import Any, Dict, Optional, Protocol, Sequence, Union

from ._errors import FailedError, ParamInvalidError

__all__ = ["ViewState"]

# Guards `ViewState.closing` against a view taken on another thread while a deregistration
# starts (the native deregistration frees the memory once it runs).
_lock = threading.Lock()


class ViewState:
    """The live views of one pooled region, and whether it is being deregistered."""

    __slots__ = ("arrays", "closing")

    def __init__(self) -> None:
        # The ctypes arrays the views stand on (unhashable: kept by their weak references).
        self.arrays: Dict[int, "weakref.ref[Any]"] = {}
        self.closing = False

    def add(self, arr: Any) -> None:
        wr = weakref.ref(arr, self._gone)
        self.arrays[id(wr)] = wr

    def _gone(self, wr: "weakref.ref[Any]") -> None:
        self.arrays.pop(id(wr), None)

    def start_deregistering(self, region: "Region") -> None:
        """Refuses (``BufferError``) while views live; else no view is given from now on."""
        with _lock:
            live = len(self.arrays)
            if live:
                raise BufferError(
                    f"{_name(region)} has {live} live view(s) (memoryview or numpy array from "
                    "Region.buffer/Region.numpy): release them (del, memoryview.release()) "
                    "before deregistering; the region's memory goes with its registration")
            self.closing = True


class Region(Protocol):
    """What a view needs of `hixl.Region` (which imports this module)."""

    name: Optional[str]
    _native: Any
    _engine: Any
    _views: Optional[ViewState]

    @property
    def addr(self) -> int: ...

    @property
    def len(self) -> int: ...


def _name(region: "Region") -> str:
    return f"pooled region {region.name!r}" if region.name else f"pooled region {region.addr:#x}"


def _int(what: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        try:
            return _int(what, operator.index(v))
        except TypeError:
            raise TypeError(f"{what} must be an int, not {type(v).__name__} ({v!r})") from None
    return v


def buffer(region: "Region", offset: int = 0, length: Optional[int] = None) -> memoryview:
    """A writable ``memoryview`` (format ``B``) of bytes ``offset .. offset + length`` of a
    pooled region (to its end when ``length`` is None)."""
    state = region._views
    if state is None:
        raise ParamInvalidError(
            f"region {region.addr:#x} ({region.name!r}) is not pooled: views are of memory "
            "the engine owns (Engine.register_pooled); a registered object is its own view "
            "(Region.obj)", value=region.addr)
    size = region.len
    offset = _int("offset", offset)
    if not 0 <= offset <= size:
        raise ParamInvalidError(
            f"offset {offset} is outside {_name(region)} of {size} bytes", value=offset)
    length = size - offset if length is None else _int("length", length)
    if not 0 <= length <= size - offset:
        raise ParamInvalidError(
            f"length {length} at offset {offset} runs past the end of {_name(region)} of "
            f"{size} bytes", value=length)
    with _lock:
        if state.closing:
            raise FailedError(f"{_name(region)} is deregistered (or being deregistered): it "
                              "gives no views", value=region.addr)
        if region._engine.closed:
            raise FailedError(f"{_name(region)}: its engine is closed; take views before "
                              "closing (they keep the memory mapped until released)",
                              value=region.addr)
        mapping = region._native._pin()
        arr = (ctypes.c_ubyte * length).from_address(mapping.addr + offset)
        # The memory stays mapped while `arr` lives: every memoryview and numpy array of it
        # holds `arr` (as its ``obj`` / ``base``).
        arr._hixl_mapping = mapping  # type: ignore[attr-defined]
        state.add(arr)
    return memoryview(arr).cast("B")


def numpy(region: "Region", dtype: Any = "uint8",
          shape: Union[None, int, Sequence[int]] = None, offset: int = 0) -> Any:
    """A writable ``numpy.ndarray`` of ``dtype`` over a pooled region from ``offset``: of
    ``shape``, or 1-D over the rest of the region (whose length must then be a multiple of
    the item size)."""
    import numpy as np

    dt = np.dtype(dtype)
    if dt.itemsize == 0 or dt.hasobject:
        raise ParamInvalidError(f"dtype {dt} cannot view raw memory", value=str(dt))
    offset = _int("offset", offset)
    if shape is None:
        rest = region.len - offset if 0 <= offset <= region.len else 0
        if rest % dt.itemsize:
            raise ParamInvalidError(
                f"the {rest} bytes of {_name(region)} from offset {offset} are not a multiple "
                f"of {dt}'s {dt.itemsize} bytes: pass shape", value=rest)
        dims: Sequence[int] = (rest // dt.itemsize,)
    else:
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        dims = tuple(_int("shape entry", d) for d in dims)
        if any(d < 0 for d in dims):
            raise ParamInvalidError(f"shape {tuple(dims)} has a negative entry", value=tuple(dims))
    count = 1
    for d in dims:
        count *= d
    mv = buffer(region, offset, count * dt.itemsize)
    return np.frombuffer(mv, dtype=dt).reshape(dims)
