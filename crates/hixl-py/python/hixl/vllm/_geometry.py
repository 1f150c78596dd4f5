"""What a prefill and a decode must agree on before a byte of KV moves, and how one block of
a KV tensor lays out its heads. Plain data only (no vLLM, no torch), so it is tested without
either.

Each worker describes itself in a *compatibility record* (a dict; the prefill's travels in
the transfer parameters). The decode compares it with its own before it links or pulls:
every key of :data:`COMPARED` must be equal, and the two tensor-parallel sizes must map
(hixl's resharded pull moves heads between any sizes whose heads divide evenly; MLA caches
are the same on every rank). A mismatch is refused with a message naming both values: a pull
between different geometries would land bytes in the wrong places, silently."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..llm_datadist import LLMException, kv_shard_sources, plan_token_blocks

#: The keys of a compatibility record both sides must hold equal, in the order they are
#: checked (and named in a refusal). The block sizes may differ where both sides can convert
#: (``convert``: a KV shard and a known block layout): each token then lands at its place
#: (``token_maps``).
COMPARED = ("params", "wire", "model", "dtype", "layout", "kv_heads", "head_size",
            "tensors_per_layer", "groups")


def block_layout(block_shape: Sequence[int], local_heads: int, block_size: int,
                 mla: bool, heads_first: bool) -> Tuple[str, int]:
    """The layout of one block of one KV tensor: ``("NHD" | "HND" | "MLA", elements per head
    per token)``. ``block_shape`` is the tensor's shape without its block dimension;
    ``heads_first`` settles ``[heads, tokens, x]`` against ``[tokens, heads, x]`` when the
    head and token counts are equal (vLLM's CPU attention is heads first)."""
    shape = tuple(int(x) for x in block_shape)
    if mla:
        # Some backends keep a heads dimension of 1 (vLLM's AMX MLA: [1, tokens, latent]).
        core = tuple(x for x in shape[:-2] if x != 1) + shape[-2:]
        if len(core) == 2 and core[0] == block_size:
            return "MLA", core[1]
        raise ValueError(f"an MLA KV block of shape {shape} is not [tokens {block_size}, latent]")
    if len(shape) == 3:
        a, b, x = shape
        hnd = (a, b) == (local_heads, block_size)
        nhd = (a, b) == (block_size, local_heads)
        if hnd and (heads_first or not nhd):
            return "HND", x
        if nhd:
            return "NHD", x
    raise ValueError(f"a KV block of shape {shape} is neither [tokens {block_size}, heads "
                     f"{local_heads}, head] nor [heads {local_heads}, tokens {block_size}, head]")


def mismatch(decode: Dict[str, Any], prefill: Dict[str, Any], decode_tp: int,
             prefill_tp: int) -> Optional[str]:
    """Why a decode (record ``decode``, TP size ``decode_tp``) must not pull from a prefill
    (``prefill``, ``prefill_tp``), or ``None`` when it may."""
    for k in COMPARED:
        mine, theirs = decode.get(k), prefill.get(k)
        if mine != theirs:
            return f"{k} differs: the prefill's is {theirs!r}, this decode's {mine!r}"
    mine, theirs = decode.get("block_size"), prefill.get("block_size")
    if mine != theirs and not (decode.get("convert") and prefill.get("convert")):
        return (f"block_size differs: the prefill's is {theirs!r}, this decode's {mine!r}, and "
                f"converting between block sizes needs a KV shard and a known block layout on "
                f"both sides (the prefill's: {bool(prefill.get('convert'))}, this decode's: "
                f"{bool(decode.get('convert'))}; a cache hixl moves as bytes, e.g. fp8, or "
                f"packed by vLLM's AMX CPU kernels, has neither)")
    if decode_tp != prefill_tp:
        try:
            for r in range(decode_tp):
                kv_shard_sources(r, decode_tp, prefill_tp, int(decode["kv_heads"]),
                                 mla=decode.get("layout") == "MLA")
        except (LLMException, ValueError, TypeError, KeyError) as e:
            return (f"prefill TP {prefill_tp} and decode TP {decode_tp} do not map over "
                    f"{decode.get('kv_heads')} KV heads: {e}")
    return None


def group_pairs(src: Sequence[Sequence[int]], dst: Sequence[Sequence[int]],
                pos: Sequence[Sequence[int]]) -> List[Tuple[List[int], List[int]]]:
    """Per KV cache group, the (prefill block, decode block) pairs to move. ``src[g]`` is the
    prefill's block list of group ``g``, one block per position of the request (block 0,
    vLLM's null block, at a sliding window's dropped positions); ``dst[g]`` the decode's blocks
    to fill and ``pos[g]`` their positions (vLLM's list of them leaves out the decode's local
    prefix hit and its null blocks, so a list index is not a position). A decode block with no
    prefill block at its position moves nothing (:func:`missing_blocks` names it)."""
    out = []
    for s, d, p in zip(src, dst, pos):
        pairs = [(a, int(b)) for i, b in zip(p, d) if int(b) != 0 and (a := _at(s, i)) != 0]
        out.append(([a for a, _ in pairs], [b for _, b in pairs]))
    return out


def _at(blocks: Sequence[int], position: int) -> int:
    """The prefill's block at ``position``, or 0 (the null block) when it holds none there."""
    i = int(position)
    return int(blocks[i]) if 0 <= i < len(blocks) else 0


def missing_blocks(src: Sequence[Sequence[int]], dst: Sequence[Sequence[int]],
                   pos: Sequence[Sequence[int]]) -> List[int]:
    """The decode's blocks that cannot land: past the prefill's blocks (it holds fewer), or
    facing its null block (the prefill dropped that position from its sliding window while
    the decode keeps it). Never pulled from somewhere else: vLLM recomputes or fails them."""
    return [int(b) for s, d, p in zip(src, dst, pos) for i, b in zip(p, d)
            if int(b) != 0 and _at(s, i) == 0]


def new_blocks(groups: Sequence[Sequence[Any]]) -> Tuple[List[List[int]], List[List[int]]]:
    """Per KV cache group, the decode's blocks a pull fills and their positions in the
    request, from the request's blocks in position order (vLLM's ``KVCacheBlocks.blocks``):
    neither a local prefix hit (a block with a hash) nor a null block (a sliding window's
    dropped positions). The blocks are those of vLLM's
    ``get_unhashed_block_ids_all_groups``."""
    ids: List[List[int]] = []
    pos: List[List[int]] = []
    for group in groups:
        keep = [(i, int(b.block_id)) for i, b in enumerate(group)
                if b.block_hash is None and not getattr(b, "is_null", False)]
        pos.append([i for i, _ in keep])
        ids.append([b for _, b in keep])
    return ids, pos


def token_maps(src: Sequence[Sequence[int]], dst: Sequence[Sequence[int]],
               pos: Sequence[Sequence[int]]) -> List[Tuple[List[Optional[int]],
                                                           List[Optional[int]]]]:
    """Per KV cache group, the request's blocks by position on each side for a pull between
    different block sizes: the prefill's (``None`` for vLLM's null block 0) and the decode's
    to fill (``None`` where nothing lands: a local prefix hit, a null block)."""
    out = []
    for s, d, p in zip(src, dst, pos):
        mine: List[Optional[int]] = [None] * (max((int(i) for i in p), default=-1) + 1)
        for i, b in zip(p, d):
            if int(b) != 0:
                mine[int(i)] = int(b)
        out.append(([int(b) if int(b) != 0 else None for b in s], mine))
    return out


def token_plans(maps: Sequence[Tuple[List[Optional[int]], List[Optional[int]]]], tokens: int,
                src_block: int, dst_block: int) -> List[Tuple[List[int], List[int]]]:
    """Per group of :func:`token_maps`, the decode blocks that land whole and those that
    cannot (the prefill holds no block for a token of theirs below ``tokens``)."""
    return [plan_token_blocks(s, d, tokens, src_block, dst_block) for s, d in maps]
