"""The worker's KV caches as one hixl blocks cache: which tensors, in which order (KV cache
group by group, so that each group is a contiguous range of layers), how a block lays out its
heads, and the compatibility record the worker advertises."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, List, Tuple

from .. import WIRE_VERSION
from ..llm_datadist import BlocksCacheKey, CacheDesc, DataType, LLMException, Placement
from ._common import PARAMS_VERSION, logger
from ._geometry import block_layout


@dataclasses.dataclass
class Layout:
    """What :func:`register` made."""

    cache: Any
    num_blocks: int
    #: bytes of one block of one registered tensor
    block_bytes: int
    #: registered tensors per layer (1: K and V in one tensor, or MLA; 2: K and V apart)
    per_layer: int
    n_tensors: int
    #: per KV cache group, its first layer and its number of layers in the registered cache
    groups: List[Tuple[int, int]]
    #: the compatibility record (``_geometry.COMPARED``)
    compat: Dict[str, Any]
    #: which dimension of each layer's tensor indexes blocks (for the host-buffer copies)
    block_dim: Dict[str, int]
    #: per KV cache group, its first registered layer and the model's index of each of its
    #: layers (``_stages``: which PP stage holds which layer)
    layers: List[Tuple[int, List[int]]] = dataclasses.field(default_factory=list)


_DTYPES = {"torch.bfloat16": DataType.DT_BF16, "torch.float16": DataType.DT_FLOAT16,
           "torch.float32": DataType.DT_FLOAT, "torch.int8": DataType.DT_INT8,
           "torch.uint8": DataType.DT_UINT8}


def _groups(kv_cache_config: Any, names: List[str]) -> List[Tuple[Any, List[str]]]:
    """(spec or None, layer names) per KV cache group, keeping only layers that have a tensor."""
    out = []
    for g in getattr(kv_cache_config, "kv_cache_groups", None) or []:
        layers = [n for n in g.layer_names if n in names]
        if layers:
            out.append((g.kv_cache_spec, layers))
    return out or [(None, list(names))]


def _layer_index(name: str) -> int:
    """The model's index of layer ``name`` (``model.layers.7.self_attn.attn`` -> 7)."""
    try:
        from vllm.model_executor.models.utils import extract_layer_index  # type: ignore
        return int(extract_layer_index(name))
    except Exception:  # a name vLLM does not parse: its last number
        found = re.findall(r"\d+", name)
        if not found:
            raise RuntimeError(f"hixl.vllm: KV cache {name} has no layer index") from None
        return int(found[-1])


def _kind(spec: Any) -> str:
    if spec is None:
        return "full"
    name = type(spec).__name__
    w = getattr(spec, "sliding_window", None)
    return f"{name}(window={w})" if w else name


def _cpu_isa(dtype: Any, block_size: int, head_size: int) -> str:
    """The kernel family vLLM's CPU attention picks for these caches ("vec", "amx", ...)."""
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa  # type: ignore
        return str(_get_attn_isa(dtype, block_size, head_size))
    except Exception as e:  # another vLLM: its layout is not known here
        return f"unknown ({type(e).__name__})"


def register(dd: Any, cluster_id: int, kv_caches: Dict[str, Any], kv_cache_config: Any,
             vllm_config: Any, tp_rank: int, tp_size: int) -> Layout:
    """Registers ``kv_caches`` (host tensors, or the host copies of device ones) with ``dd``'s
    cache manager and declares this rank's KV shard. A layer is ``(num_blocks, ...)`` (vLLM's
    CPU attention: ``[blocks, heads, tokens, 2 x head]``, per head its tokens' K rows then their
    V rows; MLA:
    ``[blocks, tokens, latent]``) or ``(2, num_blocks, ...)`` (K and V apart, each
    ``[blocks, tokens, heads, head]``); every layer must have the same block layout."""
    nb = int(kv_cache_config.num_blocks)
    addrs: List[int] = []
    block_dim: Dict[str, int] = {}
    groups: List[Tuple[int, int]] = []
    layers: List[Tuple[int, List[int]]] = []
    kinds: List[str] = []
    ref: Any = None
    spec: Any = None
    block_bytes = 0
    # Layers of different groups may share a tensor (vLLM overlays the groups of a hybrid
    # model: a block id belongs to one group at a time): each tensor is registered once, and
    # a group's layers are the registered layers its tensors are.
    layer_of: Dict[int, int] = {}
    for gspec, names in _groups(kv_cache_config, list(kv_caches)):
        kinds.append(_kind(gspec))
        spec = spec if spec is not None else gspec
        mine: List[int] = []
        for name in names:
            t = kv_caches[name]
            if t.shape[0] == nb and t.is_contiguous():
                views, block_dim[name] = [t], 0
            elif t.dim() >= 2 and t.shape[0] == 2 and t.shape[1] == nb and t[0].is_contiguous():
                views, block_dim[name] = [t[0], t[1]], 1
            else:
                raise RuntimeError(f"hixl.vllm: KV cache {name} has shape {tuple(t.shape)} and "
                                   f"strides {t.stride()}: no dimension of {nb} blocks with "
                                   "contiguous blocks")
            key = (tuple(int(x) for x in views[0].shape[1:]), len(views), str(t.dtype))
            if ref is None:
                ref, block_bytes = key, int(views[0].stride(0)) * t.element_size()
            elif key != ref:
                raise RuntimeError(f"hixl.vllm: KV cache {name} (blocks of {key[0]}, {key[1]} "
                                   f"tensor(s), {key[2]}) differs from the layers before it "
                                   f"({ref[0]}, {ref[1]}, {ref[2]}): hixl.vllm needs one "
                                   "block layout for every layer")
            ptr = int(views[0].data_ptr())
            if ptr not in layer_of:
                layer_of[ptr] = len(layer_of)
                addrs.extend(int(v.data_ptr()) for v in views)
            mine.append(layer_of[ptr])
        if mine != list(range(mine[0], mine[0] + len(mine))):
            raise RuntimeError(f"hixl.vllm: the layers of KV cache group {len(groups)} are "
                               f"registered layers {mine}, not a contiguous range")
        groups.append((mine[0], len(mine)))
        layers.append((mine[0], [_layer_index(n) for n in names]))
    if ref is None:
        raise RuntimeError("hixl.vllm: no KV cache to register")
    block_shape, per_layer, dtype = ref
    mla = spec is not None and "MLA" in type(spec).__name__
    model = vllm_config.model_config
    if spec is not None:
        block_size, local_heads = int(spec.block_size), int(getattr(spec, "num_kv_heads", 1))
    else:
        block_size = int(vllm_config.cache_config.block_size)
        local_heads = int(model.get_num_kv_heads(vllm_config.parallel_config))
    total_heads = 1 if mla else int(model.get_total_num_kv_heads())
    try:
        layout, head = block_layout(block_shape, local_heads, block_size, mla,
                                    heads_first=per_layer == 1)
    except ValueError as e:
        raise RuntimeError(f"hixl.vllm: {e}") from None
    # The layout the native shard declares, and whether a token's place in a block is known
    # (so that blocks of different sizes convert).
    shard_layout, convert = ("NHD" if layout == "MLA" else layout), True
    if layout == "HND" and per_layer == 1:
        # vLLM's CPU attention: its [heads, tokens, 2 x head] block holds, per head, a K plane
        # [head, tokens] (transposed) then a V plane [tokens, head] with its `vec` kernels;
        # other kernels (AMX) pack it otherwise: heads still move whole between TP sizes,
        # but blocks of different sizes do not convert.
        isa = _cpu_isa(kv_caches[next(iter(kv_caches))].dtype, block_size, head // 2)
        if isa == "vec":
            layout = shard_layout = "HND_KV"
        else:
            layout, convert = f"HND/{isa}", False
    dt = _DTYPES.get(dtype)
    if dt is None:  # e.g. an fp8 cache: moved as bytes, between equal TP sizes only
        desc = CacheDesc(num_tensors=len(addrs), shape=(nb, block_bytes),
                         data_type=DataType.DT_UINT8, placement=Placement.HOST)
    else:
        # An MLA block is described as [tokens, latent] whatever singleton dimensions the
        # backend keeps (the bytes are the same).
        shape = (nb, block_size, head) if layout == "MLA" else (nb, *block_shape)
        desc = CacheDesc(num_tensors=len(addrs), shape=shape, data_type=dt,
                         placement=Placement.HOST)
    cm = dd.cache_manager
    cache = cm.register_blocks_cache(desc, addrs, BlocksCacheKey(cluster_id, 0))
    shard = False
    if dt is not None:
        try:
            cm.set_kv_shard(cache, tp_rank, tp_size, total_heads, head, layout=shard_layout,
                            mla=mla)
            shard = True
        except LLMException as e:
            logger.warning("hixl: no KV shard declared (%s): pulls between different TP "
                           "sizes or block sizes are refused", e)
    compat = {"params": PARAMS_VERSION, "wire": int(WIRE_VERSION), "model": str(model.model),
              "dtype": dtype, "block_size": block_size, "layout": layout,
              "kv_heads": total_heads, "head_size": head, "tensors_per_layer": per_layer,
              "groups": kinds, "convert": shard and convert}
    return Layout(cache=cache, num_blocks=nb, block_bytes=block_bytes, per_layer=per_layer,
                  n_tensors=len(addrs), groups=groups, compat=compat, block_dim=block_dim,
                  layers=layers)
