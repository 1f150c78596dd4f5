"""What a caller's memory is to the engine: descriptor arrays (N×3 or N×6 ``uint64``, other
integer arrays converted) and registrable buffers (the buffer protocol, or a host tensor through
DLPack), each as (address, length or rows, what keeps it alive)."""

from __future__ import annotations

import ctypes
from typing import Any, Optional, Sequence, Tuple, Union

from . import _hixl
from ._errors import ParamInvalidError, UnsupportedError

__all__ = ["Desc", "Descs"]

# --- descriptors -----------------------------------------------------------------------------

Desc = Tuple[int, int, int]
Descs = Union[Sequence[Desc], Any]


def _array_ptr(descs: Any, width: int) -> Optional[Tuple[int, int, Any]]:
    """(pointer, rows, owner) of an N×width uint64 C-contiguous array, converting other integer
    arrays (through numpy) when needed; None for a non-array."""
    ai = getattr(descs, "__array_interface__", None)
    if ai is None:
        return None
    shape = ai.get("shape", ())
    if len(shape) != 2 or shape[1] != width:
        raise ParamInvalidError(
            f"descriptor array of shape {tuple(shape)}: expected (N, {width})",
            value=tuple(shape))
    if ai.get("typestr") == "<u8" and ai.get("strides") is None:
        return ai["data"][0], shape[0], descs
    import numpy as np

    arr = np.asarray(descs)
    if arr.dtype.kind not in "iu":
        raise ParamInvalidError(f"descriptor array of dtype {arr.dtype}: expected integers",
                                value=str(arr.dtype))
    if arr.dtype.kind == "i" and arr.size and int(arr.min()) < 0:
        raise ParamInvalidError("descriptor array holds a negative value",
                                value=int(arr.min()))
    arr = np.ascontiguousarray(arr, dtype=np.uint64)
    return arr.ctypes.data, arr.shape[0], arr


# --- memory ----------------------------------------------------------------------------------


def _dlpack_span(obj: Any) -> Tuple[int, int, Any]:
    dev = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (1, 0)
    if int(dev[0]) not in (1, 3):  # kDLCPU, kDLCUDAHost (pinned host memory)
        raise UnsupportedError(
            f"a tensor on DLPack device {tuple(dev)} is device memory; this build has no device "
            "runtime (CUDA, Ascend ACL) and registers host memory only", value=tuple(dev))
    capsule = obj.__dlpack__()
    addr, nbytes = _hixl.dlpack_span(capsule)
    # The capsule owns a reference to the tensor until it is destroyed (its destructor calls
    # the producer's deleter): holding it keeps the memory alive.
    return addr, nbytes, (obj, capsule)


def _buffer_span(obj: Any) -> Tuple[int, int, Any]:
    """(address, length, keepalive) of a writable, contiguous buffer."""
    if isinstance(obj, memoryview):
        mv = obj
    else:
        try:
            mv = memoryview(obj)
        except TypeError:
            if hasattr(obj, "__dlpack__"):
                return _dlpack_span(obj)
            raise ParamInvalidError(
                f"cannot register a {type(obj).__name__}: it has neither a buffer nor "
                "__dlpack__", value=type(obj).__name__) from None
    if mv.readonly:
        raise ParamInvalidError(f"cannot register a read-only {type(obj).__name__} buffer",
                                value=type(obj).__name__)
    if not mv.c_contiguous:
        raise ParamInvalidError(f"cannot register a non-contiguous {type(obj).__name__} buffer",
                                value=type(obj).__name__)
    if mv.nbytes == 0:
        raise ParamInvalidError("cannot register an empty buffer", value=0)
    # A ctypes array over the buffer holds a buffer export: the object cannot be resized or
    # freed while it lives, so the address stays valid until deregistration drops it.
    flat = mv.cast("B")
    cbuf = (ctypes.c_char * flat.nbytes).from_buffer(flat)
    return ctypes.addressof(cbuf), flat.nbytes, (obj, flat, cbuf)
