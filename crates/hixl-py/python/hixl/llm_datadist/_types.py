"""LLM-DataDist's value types: roles, placements, data types, cache descriptors and keys,
layer-wise transfer configs, and hixl's lease types (cluster infos and the configuration
builder are in ``_config``)."""

from __future__ import annotations

import enum
import json
import threading
from typing import (Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union)

from ._status import LLMException, LLMStatusCode, _type_error, _value_error

__all__ = [
    "LLMRole", "Placement", "DataType", "Memtype", "MemInfo", "CacheDesc", "Cache",
    "BlocksCacheKey", "CacheKey", "CacheKeyByIdAndIndex", "TransferConfig",
    "TransferWithCacheKeyConfig", "LayerSynchronizer", "CacheTask", "LeaseGrant", "EndedLease",
    "RegisterMemStatus",
]

_U64 = 2**64 - 1
_U32 = 2**32 - 1
_INVALID_ID = _U64


def _int(name: str, value: Any, lo: int = 0, hi: int = _U64) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if not lo <= value <= hi:
        raise _value_error(f"{name} = {value} is out of range [{lo}, {hi}]")
    return int(value)


def _ints(name: str, values: Any, lo: int = 0, hi: int = _U64) -> List[int]:
    if values is None:
        return []
    if not isinstance(values, (list, tuple, range)):
        raise _type_error(f"{name} must be a list or tuple of ints, got {type(values).__name__}")
    return [_int(f"{name}[{i}]", v, lo, hi) for i, v in enumerate(values)]


def _layer_range(name: str, r: Any) -> Optional[Tuple[int, int]]:
    """A layer range (a ``range`` of step 1) as ``(start, stop)``; ``None`` is every layer."""
    if r is None:
        return None
    if not isinstance(r, range):
        raise _type_error(f"{name} must be a range, got {r!r}")
    if r.step != 1:
        raise _value_error(f"{name} = {r!r}: its step must be 1")
    if r.start < 0 or r.stop <= r.start:
        raise _value_error(f"{name} = {r!r} is empty or starts below 0")
    if r.stop > _U32:
        raise _value_error(f"{name} = {r!r} is past 2^32 - 1")
    return (r.start, r.stop)


class LLMRole(enum.IntEnum):
    """A cluster's role. As in LLM-DataDist it is a label only: it does not change transfers."""

    PROMPT = 1
    DECODER = 2
    MIX = 3

    def __str__(self) -> str:
        return f"{self.__class__.__name__}.{self.name}"


class Placement(enum.IntEnum):
    """Where a cache lives. hixl moves host memory; ``DEVICE`` needs a device runtime this
    build does not have, and registering a ``DEVICE`` cache raises ``LLM_FEATURE_NOT_ENABLED``."""

    HOST = 0
    DEVICE = 1

    def __str__(self) -> str:
        return f"{self.__class__.__name__}.{self.name}"


class DataType(enum.Enum):
    """Element types of cache tensors (the ones hixl knows), valued as ``ge::DataType``."""

    DT_FLOAT = 0
    DT_FLOAT16 = 1
    DT_INT8 = 2
    DT_INT32 = 3
    DT_UINT8 = 4
    DT_INT16 = 6
    DT_INT64 = 9
    DT_BF16 = 27

    def __str__(self) -> str:
        return f"{self.__class__.__name__}.{self.name}"

    @property
    def size(self) -> int:
        """Bytes per element."""
        return _DT_SIZE[self]


_DT_SIZE = {
    DataType.DT_FLOAT: 4, DataType.DT_FLOAT16: 2, DataType.DT_INT8: 1, DataType.DT_INT32: 4,
    DataType.DT_UINT8: 1, DataType.DT_INT16: 2, DataType.DT_INT64: 8, DataType.DT_BF16: 2,
}


class Memtype(enum.IntEnum):
    """Memory kinds of :class:`MemInfo`."""

    MEM_TYPE_DEVICE = 0
    MEM_TYPE_HOST = 1


class RegisterMemStatus(enum.IntEnum):
    """Status of the legacy two-sided link's memory registration (not used by hixl)."""

    OK = 0
    PREPARING = 1
    FAILED = 2


class MemInfo:
    """A memory range (``remap_registered_memory``; reserved, as in LLM-DataDist)."""

    def __init__(self, mem_type: Memtype, addr: int, size: int) -> None:
        if not isinstance(mem_type, Memtype):
            raise _type_error(f"mem_type must be a Memtype, got {mem_type!r}")
        self.mem_type = mem_type
        self.addr = _int("addr", addr)
        self.size = _int("size", size)


class CacheDesc:
    """Shape and type of a cache's tensors.

    ``shape[0]`` is the number of blocks (blocks cache) or the batch size (contiguous cache);
    block (or batch entry) ``b`` of tensor ``t`` is at ``tensor_addrs[t] + b * size / shape[0]``.

    Args:
        num_tensors: tensors in the cache (K, V, K, V, ... for two tensors per layer).
        shape: shape of each tensor.
        data_type: a :class:`DataType`.
        placement: :attr:`Placement.DEVICE` (the default, as in LLM-DataDist) or
            :attr:`Placement.HOST`. hixl moves host memory: give ``Placement.HOST``.
        batch_dim_index: the batch (or block) dimension; hixl supports 0.
        seq_len_dim_index: accepted for compatibility.
        kv_tensor_format: accepted for compatibility.
    """

    def __init__(self, num_tensors: int, shape: Union[Tuple[int, ...], List[int]],
                 data_type: DataType, placement: Placement = Placement.DEVICE,
                 batch_dim_index: int = 0, seq_len_dim_index: int = -1,
                 kv_tensor_format: Optional[str] = None) -> None:
        self._num_tensors = _int("num_tensors", num_tensors, 1, _U32)
        if not isinstance(shape, (list, tuple)) or not shape:
            raise _type_error(f"shape must be a non-empty list or tuple of ints, got {shape!r}")
        self._shape = [_int(f"shape[{i}]", d, 1, 2**63 - 1) for i, d in enumerate(shape)]
        if not isinstance(data_type, DataType):
            raise _type_error(f"data_type must be a DataType, got {data_type!r}")
        self._data_type = data_type
        if not isinstance(placement, Placement):
            raise _type_error(f"placement must be a Placement, got {placement!r}")
        self._placement = placement
        self._batch_dim_index = _int("batch_dim_index", batch_dim_index, 0, len(self._shape) - 1)
        if not isinstance(seq_len_dim_index, int):
            raise _type_error(f"seq_len_dim_index must be an int, got {seq_len_dim_index!r}")
        self._seq_len_dim_index = seq_len_dim_index
        if kv_tensor_format is not None and not isinstance(kv_tensor_format, str):
            raise _type_error(f"kv_tensor_format must be a str, got {kv_tensor_format!r}")
        self._kv_tensor_format = kv_tensor_format

    num_tensors = property(lambda self: self._num_tensors, doc="Tensors in the cache.")
    shape = property(lambda self: list(self._shape), doc="Shape of each tensor.")
    data_type = property(lambda self: self._data_type, doc="Element type.")
    placement = property(lambda self: self._placement, doc="Host or device.")
    batch_dim_index = property(lambda self: self._batch_dim_index, doc="Batch dimension.")
    batch_dim = batch_dim_index
    seq_len_dim_index = property(lambda self: self._seq_len_dim_index, doc="Sequence dimension.")
    kv_tensor_format = property(lambda self: self._kv_tensor_format, doc="Format, if given.")

    @property
    def batch_size(self) -> int:
        """``shape[batch_dim_index]``: blocks, or batch entries."""
        return self._shape[self._batch_dim_index]

    @property
    def size(self) -> int:
        """Bytes of one tensor: ``prod(shape) * element size``."""
        n = self._data_type.size
        for d in self._shape:
            n *= d
        return n

    def __repr__(self) -> str:
        return (f"CacheDesc(num_tensors={self._num_tensors}, shape={self._shape}, "
                f"data_type={self._data_type}, placement={self._placement})")


class Cache:
    """A registered cache: its id, descriptor and tensor addresses (returned by
    ``register_cache`` / ``register_blocks_cache``; :meth:`create_cpu_cache` describes host
    tensors without registering them, for ``swap_blocks``)."""

    def __init__(self, cache_id: int, cache_desc: CacheDesc, tensor_addrs: List[int],
                 is_blocks_cache: bool = False, _owner: Any = None) -> None:
        self._cache_id = cache_id
        self._cache_desc = cache_desc
        self._tensor_addrs = list(tensor_addrs)
        self._is_blocks = is_blocks_cache
        self._owner = _owner
        self._keepalive: List[Any] = []

    cache_id = property(lambda self: self._cache_id, doc="The id peers address it by.")
    cache_desc = property(lambda self: self._cache_desc, doc="Its :class:`CacheDesc`.")
    tensor_addrs = property(lambda self: list(self._tensor_addrs), doc="Tensor addresses.")
    is_blocks_cache = property(lambda self: self._is_blocks, doc="A blocks (paged) cache.")

    @staticmethod
    def create_cpu_cache(cache_desc: CacheDesc, addrs: List[int]) -> "Cache":
        """Describes host tensors at ``addrs`` as an unregistered cache (id -1), e.g. the host
        side of ``swap_blocks``. The caller keeps the memory alive while it is used."""
        if not isinstance(cache_desc, CacheDesc):
            raise _type_error(f"cache_desc must be a CacheDesc, got {cache_desc!r}")
        addrs = _ints("addrs", addrs, 1)
        if len(addrs) != cache_desc.num_tensors:
            raise _value_error(f"{len(addrs)} addresses for {cache_desc.num_tensors} tensors")
        return Cache(-1, cache_desc, addrs, True)

    def __repr__(self) -> str:
        return f"Cache(cache_id={self._cache_id}, cache_desc={self._cache_desc!r})"


class BlocksCacheKey:
    """Names a blocks cache remotely: ``(cluster_id, model_id)``. Distinct caches of one
    cluster need distinct ``model_id`` s (hixl refuses a key already in use)."""

    def __init__(self, cluster_id: Optional[int] = None, model_id: int = 0, *,
                 prompt_cluster_id: Optional[int] = None) -> None:
        if cluster_id is None:
            cluster_id = prompt_cluster_id
        if cluster_id is None:
            raise _type_error("BlocksCacheKey needs cluster_id")
        self._cluster_id = _int("cluster_id", cluster_id)
        self._model_id = _int("model_id", model_id)

    cluster_id = property(lambda self: self._cluster_id, doc="The owning cluster.")
    prompt_cluster_id = cluster_id
    model_id = property(lambda self: self._model_id, doc="The model.")

    def _tuple(self) -> Tuple[int, int]:
        return (self._cluster_id, self._model_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BlocksCacheKey) and self._tuple() == other._tuple()

    def __hash__(self) -> int:
        return hash(("BlocksCacheKey",) + self._tuple())

    def __repr__(self) -> str:
        return f"BlocksCacheKey(cluster_id={self._cluster_id}, model_id={self._model_id})"


class CacheKey:
    """Names one batch entry of a contiguous cache by the request it holds. The owner gives the
    keys to ``register_cache`` (key ``i`` names batch entry ``i``)."""

    def __init__(self, cluster_id: Optional[int] = None, req_id: Optional[int] = None,
                 model_id: int = 0, prefix_id: int = _INVALID_ID, *,
                 prompt_cluster_id: Optional[int] = None) -> None:
        if cluster_id is None:
            cluster_id = prompt_cluster_id
        if cluster_id is None or req_id is None:
            raise _type_error("CacheKey needs cluster_id and req_id")
        self._cluster_id = _int("cluster_id", cluster_id)
        self._req_id = _int("req_id", req_id)
        self._model_id = _int("model_id", model_id)
        self._prefix_id = _int("prefix_id", prefix_id)

    cluster_id = property(lambda self: self._cluster_id, doc="The owning cluster.")
    prompt_cluster_id = cluster_id
    req_id = property(lambda self: self._req_id, doc="The request.")
    model_id = property(lambda self: self._model_id, doc="The model.")
    prefix_id = property(lambda self: self._prefix_id, doc="The prefix (2**64-1: none).")

    def _tuple(self) -> Tuple[int, int, int, int]:
        return (self._cluster_id, self._req_id, self._model_id, self._prefix_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CacheKey) and self._tuple() == other._tuple()

    def __hash__(self) -> int:
        return hash(("CacheKey",) + self._tuple())

    def __repr__(self) -> str:
        return (f"CacheKey(cluster_id={self._cluster_id}, req_id={self._req_id}, "
                f"model_id={self._model_id}, prefix_id={self._prefix_id})")


class CacheKeyByIdAndIndex:
    """Names a peer's cache by the id its ``register_*`` returned there, and a batch entry."""

    def __init__(self, cluster_id: int, cache_id: int, batch_index: int = 0) -> None:
        self._cluster_id = _int("cluster_id", cluster_id)
        self._cache_id = _int("cache_id", cache_id, 0, 2**63 - 1)
        self._batch_index = _int("batch_index", batch_index, 0, _U32)

    cluster_id = property(lambda self: self._cluster_id, doc="The owning cluster.")
    cache_id = property(lambda self: self._cache_id, doc="The cache's id there.")
    batch_index = property(lambda self: self._batch_index, doc="The batch entry.")

    def _tuple(self) -> Tuple[int, int, int]:
        return (self._cluster_id, self._cache_id, self._batch_index)

    def __repr__(self) -> str:
        return (f"CacheKeyByIdAndIndex(cluster_id={self._cluster_id}, "
                f"cache_id={self._cache_id}, batch_index={self._batch_index})")


class TransferConfig:
    """A destination of ``transfer_cache_async`` by address: the peer ``dst_cluster_id``'s
    tensors at ``dst_addrs`` (two per layer of ``src_layer_range``, K then V; for a contiguous
    destination with a batch index other than 0, offset to that entry), fed from
    ``src_layer_range`` (default every layer) and batch entry ``src_batch_index`` of the source.
    The addresses must be those of a cache the peer registered."""

    def __init__(self, dst_cluster_id: int, dst_addrs: List[int],
                 src_layer_range: Optional[range] = None, src_batch_index: int = 0) -> None:
        self.dst_cluster_id = _int("dst_cluster_id", dst_cluster_id)
        self.dst_addrs = _ints("dst_addrs", dst_addrs, 1)
        _layer_range("src_layer_range", src_layer_range)
        self.src_layer_range = src_layer_range
        self.src_batch_index = _int("src_batch_index", src_batch_index, 0, _U32)
        self.dst_layer_range: Optional[range] = None


class TransferWithCacheKeyConfig:
    """A destination of ``transfer_cache_async`` by key: the peer's blocks cache
    (:class:`BlocksCacheKey`) or cache and batch entry (:class:`CacheKeyByIdAndIndex`); layers
    ``src_layer_range`` of the source go to ``dst_layer_range`` (same length)."""

    def __init__(self, cache_key: Union[BlocksCacheKey, CacheKeyByIdAndIndex],
                 src_layer_range: Optional[range] = None,
                 dst_layer_range: Optional[range] = None, src_batch_index: int = 0) -> None:
        if not isinstance(cache_key, (BlocksCacheKey, CacheKeyByIdAndIndex)):
            raise _type_error(
                f"cache_key must be a BlocksCacheKey or CacheKeyByIdAndIndex, got {cache_key!r}")
        self.cache_key = cache_key
        s = _layer_range("src_layer_range", src_layer_range)
        d = _layer_range("dst_layer_range", dst_layer_range)
        if s is not None and d is not None and s[1] - s[0] != d[1] - d[0]:
            raise _value_error(f"src_layer_range {src_layer_range!r} and dst_layer_range "
                               f"{dst_layer_range!r} differ in length")
        self.src_layer_range = src_layer_range
        self.dst_layer_range = dst_layer_range
        self.src_batch_index = _int("src_batch_index", src_batch_index, 0, _U32)
        if isinstance(cache_key, BlocksCacheKey) and self.src_batch_index != 0:
            raise _value_error(f"src_batch_index {src_batch_index} must be 0 for a "
                               "BlocksCacheKey destination")

    @property
    def dst_cluster_id(self) -> int:
        """The destination cluster."""
        return int(self.cache_key.cluster_id)


class LayerSynchronizer:
    """Subclass it and implement :meth:`synchronize_layer`; ``transfer_cache_async`` calls it
    once per source layer, in order, on its own thread, and sends that layer as soon as it
    returns True (typically after waiting for an event recorded when the layer's compute ended).
    """

    def synchronize_layer(self, layer_index: int, timeout_in_millis: Optional[int]) -> bool:
        """Waits until layer ``layer_index`` is computed; True to send it, False to stop the
        transfer (the configs waiting for it report ``LLM_PARAM_INVALID``)."""
        raise NotImplementedError("LayerSynchronizer.synchronize_layer must be implemented")


class CacheTask:
    """The asynchronous layer-wise transfer ``transfer_cache_async`` returned."""

    def __init__(self, thread: threading.Thread, n: int,
                 results: List[Optional[LLMStatusCode]],
                 errors: List[Optional[LLMException]]) -> None:
        self._thread = thread
        self._n = n
        self._results = results
        self._errors = errors

    def _join(self, timeout_in_millis: Optional[int]) -> bool:
        if timeout_in_millis is None:
            self._thread.join()
        else:
            _int("timeout_in_millis", timeout_in_millis, 0, 2**63 - 1)
            self._thread.join(timeout_in_millis / 1000.0)
        return not self._thread.is_alive()

    def synchronize(self, timeout_in_millis: Optional[int] = None) -> LLMStatusCode:
        """Waits for every layer (``None``: without limit) and returns the overall status:
        ``LLM_SUCCESS``, the first failing config's code, or ``LLM_TIMEOUT`` when the transfer
        did not finish in time."""
        if not self._join(timeout_in_millis):
            return LLMStatusCode.LLM_TIMEOUT
        for r in self._results:
            if r is not None and r != LLMStatusCode.LLM_SUCCESS:
                return r
        return LLMStatusCode.LLM_SUCCESS

    def get_results(self, timeout_in_millis: Optional[int] = None) -> List[Optional[LLMStatusCode]]:
        """Waits as :meth:`synchronize` does; one status per transfer config (``None`` for a
        config no layer was sent to; ``LLM_TIMEOUT`` for each when not finished in time)."""
        if not self._join(timeout_in_millis):
            return [LLMStatusCode.LLM_TIMEOUT] * self._n
        return list(self._results)

    def get_errors(self, timeout_in_millis: Optional[int] = None) -> List[Optional[LLMException]]:
        """hixl extension: per config, the exception of a failed config (its ``failed_blocks``
        list the (layer, block) pairs that did not land), else None."""
        if not self._join(timeout_in_millis):
            return [LLMException("the layer-wise transfer did not finish in time",
                                 LLMStatusCode.LLM_TIMEOUT)] * self._n
        return list(self._errors)


class LeaseGrant:
    """hixl extension: a request-scoped lease of blocks, as the owner (prefill) granted it with
    ``cache_manager.lease_blocks``. Hand it to the puller (decode) out of band:
    :meth:`to_dict` / :meth:`to_json` there, :meth:`from_dict` / :meth:`from_json` here."""

    _FIELDS = ("owner", "lease_id", "generation", "request_id", "caches", "blocks", "ttl_ms")

    def __init__(self, owner: int, lease_id: int, generation: int, request_id: int,
                 caches: Sequence[int], blocks: Sequence[int], ttl_ms: int) -> None:
        self.owner = _int("owner", owner)
        self.lease_id = _int("lease_id", lease_id)
        self.generation = _int("generation", generation)
        self.request_id = _int("request_id", request_id)
        self.caches = _ints("caches", list(caches), -2**63, 2**63 - 1)
        self.blocks = _ints("blocks", list(blocks))
        self.ttl_ms = _int("ttl_ms", ttl_ms)

    def to_dict(self) -> Dict[str, Any]:
        """The grant as a JSON-able dict."""
        return {f: getattr(self, f) for f in self._FIELDS}

    def to_json(self) -> str:
        """The grant as JSON."""
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "LeaseGrant":
        """The grant :meth:`to_dict` gave."""
        if not isinstance(d, dict):
            raise _type_error(f"a lease grant dict is expected, got {d!r}")
        missing = [f for f in cls._FIELDS if f not in d]
        if missing:
            raise _value_error(f"lease grant {d!r} lacks {missing}")
        return cls(**{f: d[f] for f in cls._FIELDS})

    @classmethod
    def from_json(cls, s: str) -> "LeaseGrant":
        """The grant :meth:`to_json` gave."""
        try:
            d = json.loads(s)
        except (TypeError, ValueError) as e:
            raise _value_error(f"lease grant {s!r} is not JSON: {e}") from None
        return cls.from_dict(d)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LeaseGrant) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return (f"LeaseGrant(owner={self.owner}, lease_id={self.lease_id}, "
                f"request_id={self.request_id}, blocks={self.blocks})")


def _grant(g: Union[LeaseGrant, Dict[str, Any], str]) -> LeaseGrant:
    if isinstance(g, LeaseGrant):
        return g
    if isinstance(g, str):
        return LeaseGrant.from_json(g)
    return LeaseGrant.from_dict(g)


class EndedLease(NamedTuple):
    """hixl extension: a lease the owner granted that ended; its blocks may be reused.
    ``why`` is ``"DONE"``, ``"EXPIRED"``, ``"LINK_DOWN"`` or ``"REVOKED"``."""

    request_id: int
    lease_id: int
    caches: List[int]
    blocks: List[int]
    why: str
