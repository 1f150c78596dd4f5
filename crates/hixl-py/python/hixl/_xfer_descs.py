"""`xfer_descs`: transfer descriptors from regions, offsets and lengths (what NIXL's
``get_xfer_descs`` is to NIXL), as the N×3 ``uint64`` array `Peer.read` / `Peer.write` /
`Peer.transfer` / `Engine.transfer` take: rows of ``(local_addr, remote_addr, len)``.

Every row is checked before an address is computed: offsets and lengths are non-negative
integers, lengths are not zero, and each piece lies inside its region. A bad one raises
``ParamInvalidError`` (a ``ValueError``) naming the descriptor and the value; a wrong type
raises ``TypeError``. No address is ever formed outside a region."""

from __future__ import annotations

import operator
from typing import Any, List, Sequence, Tuple, Union

from ._engine import Region, RemoteRegion
from ._errors import HixlError, ParamInvalidError

__all__ = ["xfer_descs", "AnyRegion", "Ints"]

#: A local or a peer's region.
AnyRegion = Union[Region, RemoteRegion]
#: An int, or a 1-D sequence or array of ints (one per descriptor).
Ints = Union[int, Sequence[int], Any]

_U64 = 1 << 64


def _np() -> Any:
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is there wherever the tests run
        raise ImportError("hixl.xfer_descs builds numpy arrays: pip install numpy") from None
    return numpy


def _label(r: AnyRegion) -> str:
    return f"{r.addr:#x}+{r.len}" + (f" {r.name!r}" if r.name else "")


def _regions(what: str, r: Union[AnyRegion, Sequence[AnyRegion]]) -> Tuple[Any, Any, List[AnyRegion]]:
    """(addresses, lengths, regions) of one region or a sequence of them, checked."""
    np = _np()
    if isinstance(r, (Region, RemoteRegion)):
        rs: List[AnyRegion] = [r]
    elif isinstance(r, (list, tuple)):
        rs = list(r)
    else:
        raise TypeError(f"{what} must be a hixl.Region, a hixl.RemoteRegion (Peer.region) or a "
                        f"list of them, not {type(r).__name__}")
    for i, x in enumerate(rs):
        if not isinstance(x, (Region, RemoteRegion)):
            raise TypeError(f"{what}[{i}] is a {type(x).__name__}, not a hixl.Region or "
                            "hixl.RemoteRegion")
        if isinstance(x, Region):
            try:
                x._native.access
            except HixlError:
                raise ParamInvalidError(f"{what} region {_label(x)} is deregistered (or its "
                                        "engine closed)", value=x.addr) from None
    addrs = np.array([x.addr for x in rs], dtype=np.uint64)
    lens = np.array([x.len for x in rs], dtype=np.uint64)
    return addrs, lens, rs


def _int(where: str, x: Any) -> int:
    if isinstance(x, bool):
        raise TypeError(f"{where} must be integers, not booleans")
    try:
        n = operator.index(x)
    except TypeError:
        raise TypeError(f"{where} is {x!r}, not an int") from None
    if n < 0:
        raise ParamInvalidError(f"{where} is {n}: negative", value=n)
    if n >= _U64:
        raise ParamInvalidError(f"{where} is {n}: past 2**64-1", value=n)
    return n


def _ints(what: str, v: Ints) -> Any:
    """A 1-D uint64 array of `v` (a scalar becomes one entry), or the error naming the bad
    entry."""
    np = _np()
    if isinstance(v, (list, tuple, range)):
        return np.array([_int(f"{what}[{i}]", x) for i, x in enumerate(v)], dtype=np.uint64)
    if not isinstance(v, np.ndarray):
        return np.array([_int(what, v)], dtype=np.uint64)
    if v.ndim > 1:
        raise ParamInvalidError(f"{what} must be an int or 1-D, not of shape {v.shape}",
                                value=v.shape)
    arr = v.reshape(-1)
    if arr.size == 0:
        return arr.astype(np.uint64)
    if arr.dtype == np.bool_:
        raise TypeError(f"{what} must be integers, not booleans")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{what} must be integers, not {arr.dtype} (e.g. {arr[0].item()!r})")
    if arr.dtype.kind == "i" and int(arr.min()) < 0:
        i = int(np.argmax(arr < 0))
        raise ParamInvalidError(f"{what}[{i}] is {int(arr[i])}: negative", value=int(arr[i]))
    return arr.astype(np.uint64, copy=False)


def xfer_descs(local: Union[AnyRegion, Sequence[AnyRegion]], local_offsets: Ints,
               remote: Union[AnyRegion, Sequence[AnyRegion]], remote_offsets: Ints,
               lengths: Ints) -> Any:
    """Descriptors as an (N, 3) ``uint64`` array of ``(local_addr, remote_addr, len)`` rows:
    row i moves ``lengths[i]`` bytes between ``local_offsets[i]`` of the local region and
    ``remote_offsets[i]`` of the remote one (``peer.region(name)``). Pass it to
    `Peer.read`, `Peer.write`, `Peer.transfer` or `Engine.transfer`.

    ``local`` and ``remote`` are a region each, or a list with one per row (a KV cache of a
    region per layer). Offsets and lengths are an int (the same for every row) or a 1-D
    sequence / integer array with one per row; all of them broadcast to N rows.

    Raises ``ParamInvalidError`` (a ``ValueError``) naming the descriptor and value when a
    piece is empty, negative or not inside its region, or the row counts differ; ``TypeError``
    for a value that is not an int or a region.

    >>> descs = hixl.xfer_descs(kv, blocks * block_bytes, peer.region("kv"),
    ...                         remote_blocks * block_bytes, block_bytes)
    >>> await peer.read(descs)
    """
    np = _np()
    la, ll, lrs = _regions("local", local)
    ra, rl, rrs = _regions("remote", remote)
    cols = {"local": la, "local_offsets": _ints("local_offsets", local_offsets),
            "remote": ra, "remote_offsets": _ints("remote_offsets", remote_offsets),
            "lengths": _ints("lengths", lengths)}
    sizes = {k: len(v) for k, v in cols.items() if len(v) != 1}
    if len(set(sizes.values())) > 1:
        named = ", ".join(f"{k} {n}" for k, n in sizes.items())
        raise ParamInvalidError(f"the rows do not match: {named} (each must have one entry, "
                                "or the same number)", value=tuple(sizes.values()))
    n = next(iter(sizes.values()), 1)
    la, ll = np.broadcast_to(la, n), np.broadcast_to(ll, n)
    ra, rl = np.broadcast_to(ra, n), np.broadcast_to(rl, n)
    lo = np.broadcast_to(cols["local_offsets"], n)
    ro = np.broadcast_to(cols["remote_offsets"], n)
    ln = np.broadcast_to(cols["lengths"], n)
    if n and not ln.all():
        i = int(np.argmin(ln))
        raise ParamInvalidError(f"descriptor {i} has zero length", value=i)
    for side, off, rlen, rs in (("local", lo, ll, lrs), ("remote", ro, rl, rrs)):
        # No sum can wrap: the length is compared with what is left after the offset.
        bad = (off > rlen) | (ln > rlen - np.minimum(off, rlen))
        if bad.any():
            i = int(np.argmax(bad))
            r = rs[i if len(rs) > 1 else 0]
            raise ParamInvalidError(
                f"descriptor {i}: {side} offset {int(off[i])} + length {int(ln[i])} is not "
                f"inside the {side} region {_label(r)}", value=int(off[i]))
    out = np.empty((n, 3), dtype=np.uint64)
    out[:, 0] = la + lo
    out[:, 1] = ra + ro
    out[:, 2] = ln
    return out
