"""Type stubs of ``hixl.llm_datadist`` (a drop-in for ``llm_datadist``)."""

import enum
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

__all__ = [
    "LLMDataDist", "CacheManager", "LLMRole", "LLMConfig", "LlmConfig", "LLMClusterInfo",
    "LLMStatusCode", "LLMException", "BlockFailure", "CacheDesc", "Cache", "BlocksCacheKey",
    "CacheKey", "CacheKeyByIdAndIndex", "Placement", "DataType", "Memtype", "MemInfo",
    "RegisterMemStatus", "TransferConfig", "TransferWithCacheKeyConfig", "LayerSynchronizer",
    "CacheTask", "LeaseGrant", "EndedLease",
]

class LLMStatusCode(enum.IntEnum):
    """LLM-DataDist status codes (``0x5010B000 + n``); ``LLM_LEASE_*`` are hixl's."""
    LLM_SUCCESS = 0
    LLM_WAIT_PROC_TIMEOUT = 0x5010b001
    LLM_WAIT_PROCESS_TIMEOUT = 0x5010b001
    LLM_KV_CACHE_NOT_EXIST = 0x5010b002
    LLM_REPEAT_REQUEST = 0x5010b003
    LLM_REQUEST_ALREADY_COMPLETED = 0x5010b004
    LLM_PARAM_INVALID = 0x5010b005
    LLM_ENGINE_FINALIZED = 0x5010b006
    LLM_NOT_YET_LINK = 0x5010b007
    LLM_ALREADY_LINK = 0x5010b008
    LLM_LINK_FAILED = 0x5010b009
    LLM_UNLINK_FAILED = 0x5010b00a
    LLM_NOTIFY_PROMPT_UNLINK_FAILED = 0x5010b00b
    LLM_CLUSTER_NUM_EXCEED_LIMIT = 0x5010b00c
    LLM_PROCESSING_LINK = 0x5010b00d
    LLM_DEVICE_OUT_OF_MEMORY = 0x5010b00e
    LLM_PREFIX_ALREADY_EXIST = 0x5010b00f
    LLM_PREFIX_NOT_EXIST = 0x5010b010
    LLM_SEQ_LEN_OVER_LIMIT = 0x5010b011
    LLM_NO_FREE_BLOCK = 0x5010b012
    LLM_BLOCKS_OUT_OF_MEMORY = 0x5010b013
    LLM_CACHE_INCOMPATIBLE = 0x5010b014
    LLM_CACHE_KEY_ALREADY_EXIST = 0x5010b015
    LLM_COPY_CACHE_FAILED = 0x5010b016
    LLM_CACHE_ID_ALREADY_EXIST = 0x5010b017
    LLM_EXIST_LINK = 0x5010b018
    LLM_FEATURE_NOT_ENABLED = 0x5010b019
    LLM_TIMEOUT = 0x5010b01a
    LLM_LINK_BUSY = 0x5010b01b
    LLM_OUT_OF_MEMORY = 0x5010b01c
    LLM_DEVICE_MEM_ERROR = 0x5010bf01
    LLM_SUSPECT_REMOTE_ERROR = 0x5010bf02
    LLM_LEASE_ENDED = 0x5010b100
    """hixl extension: the lease is not live (done, expired, link down, revoked); nothing moved."""
    LLM_LEASE_HELD = 0x5010b101
    """hixl extension: a live lease holds the blocks or cache."""
    LLM_FAILED = 0xffffffff
    LLM_UNKNOWN_ERROR = -1

class BlockFailure(NamedTuple):
    """hixl extension: a (layer, block) pair of a block transfer that did not land."""
    src_layer: int
    dst_layer: int
    src_block: int
    dst_block: int

class LLMException(RuntimeError):
    """Raised by every failing call. Bad-argument errors are also ``TypeError``/``ValueError``."""
    failed_blocks: List[BlockFailure]
    """hixl extension: the pairs of a partly failed block transfer that did not land."""
    def __init__(self, message: str, status_code: LLMStatusCode = ...,
                 failed_blocks: Sequence[Tuple[int, int, int, int]] = ...) -> None: ...
    @property
    def status_code(self) -> LLMStatusCode:
        """The error's status."""

class LLMRole(enum.IntEnum):
    """A cluster's role (a label)."""
    PROMPT = 1
    DECODER = 2
    MIX = 3

class Placement(enum.IntEnum):
    """Where a cache lives; hixl registers ``HOST`` memory only."""
    HOST = 0
    DEVICE = 1

class DataType(enum.Enum):
    """Element types hixl knows."""
    DT_FLOAT = 0
    DT_FLOAT16 = 1
    DT_INT8 = 2
    DT_INT32 = 3
    DT_UINT8 = 4
    DT_INT16 = 6
    DT_INT64 = 9
    DT_BF16 = 27
    @property
    def size(self) -> int:
        """Bytes per element."""

class Memtype(enum.IntEnum):
    """Memory kinds of :class:`MemInfo`."""
    MEM_TYPE_DEVICE = 0
    MEM_TYPE_HOST = 1

class RegisterMemStatus(enum.IntEnum):
    """The legacy two-sided link's registration status (unused)."""
    OK = 0
    PREPARING = 1
    FAILED = 2

class MemInfo:
    """A memory range (``remap_registered_memory``, reserved)."""
    mem_type: Memtype
    addr: int
    size: int
    def __init__(self, mem_type: Memtype, addr: int, size: int) -> None: ...

class CacheDesc:
    """Shape and type of a cache's tensors; ``shape[0]`` blocks or batch entries."""
    def __init__(self, num_tensors: int, shape: Union[Tuple[int, ...], List[int]],
                 data_type: DataType, placement: Placement = ..., batch_dim_index: int = 0,
                 seq_len_dim_index: int = -1, kv_tensor_format: Optional[str] = None) -> None: ...
    @property
    def num_tensors(self) -> int: ...
    @property
    def shape(self) -> List[int]: ...
    @property
    def data_type(self) -> DataType: ...
    @property
    def placement(self) -> Placement: ...
    @property
    def batch_dim_index(self) -> int: ...
    @property
    def batch_dim(self) -> int: ...
    @property
    def seq_len_dim_index(self) -> int: ...
    @property
    def kv_tensor_format(self) -> Optional[str]: ...
    @property
    def batch_size(self) -> int:
        """Blocks (or batch entries): ``shape[batch_dim_index]``."""
    @property
    def size(self) -> int:
        """Bytes of one tensor."""

class Cache:
    """A registered cache."""
    @property
    def cache_id(self) -> int: ...
    @property
    def cache_desc(self) -> CacheDesc: ...
    @property
    def tensor_addrs(self) -> List[int]: ...
    @property
    def is_blocks_cache(self) -> bool: ...
    @staticmethod
    def create_cpu_cache(cache_desc: CacheDesc, addrs: List[int]) -> "Cache":
        """Unregistered host tensors (for ``swap_blocks``)."""

class BlocksCacheKey:
    """Names a blocks cache remotely: ``(cluster_id, model_id)``."""
    def __init__(self, cluster_id: Optional[int] = None, model_id: int = 0, *,
                 prompt_cluster_id: Optional[int] = None) -> None: ...
    @property
    def cluster_id(self) -> int: ...
    @property
    def prompt_cluster_id(self) -> int: ...
    @property
    def model_id(self) -> int: ...

class CacheKey:
    """Names a batch entry of a contiguous cache by request."""
    def __init__(self, cluster_id: Optional[int] = None, req_id: Optional[int] = None,
                 model_id: int = 0, prefix_id: int = ..., *,
                 prompt_cluster_id: Optional[int] = None) -> None: ...
    @property
    def cluster_id(self) -> int: ...
    @property
    def prompt_cluster_id(self) -> int: ...
    @property
    def req_id(self) -> int: ...
    @property
    def model_id(self) -> int: ...
    @property
    def prefix_id(self) -> int: ...

class CacheKeyByIdAndIndex:
    """Names a peer's cache by id, and a batch entry."""
    def __init__(self, cluster_id: int, cache_id: int, batch_index: int = 0) -> None: ...
    @property
    def cluster_id(self) -> int: ...
    @property
    def cache_id(self) -> int: ...
    @property
    def batch_index(self) -> int: ...

class LLMClusterInfo:
    """A remote cluster to link with."""
    remote_cluster_id: Optional[int]
    remote_role_type: Optional[Union[LLMRole, int]]
    #: hixl extension: the peer's ``hixl.Name``, linked by through ``hixl.Directory``
    remote_name: Optional[str]
    def __init__(self) -> None: ...
    @property
    def local_ip_info_list(self) -> List[Tuple[Union[int, str], int]]: ...
    @property
    def remote_ip_info_list(self) -> List[Tuple[Union[int, str], int]]: ...
    def append_local_ip_info(self, ip: Union[str, int], port: int) -> None:
        """Adds a local address (accepted for compatibility)."""
    def append_remote_ip_info(self, ip: Union[str, int], port: int) -> None:
        """Adds the remote cluster's listen address."""

class LLMConfig:
    """Builds :meth:`LLMDataDist.init`'s options."""
    ge_options: Dict[str, str]
    device_id: Optional[Union[int, List[int]]]
    sync_kv_timeout: Optional[Union[int, str]]
    listen_ip_info: str
    enable_cache_manager: bool
    enable_remote_cache_accessible: bool
    enable_switch_role: bool
    mem_pool_cfg: str
    host_mem_pool_cfg: str
    buf_pool_cfg: str
    local_comm_res: str
    transfer_backend: str
    global_resource_config: str
    deploy_res_path: str
    rdma_traffic_class: Optional[int]
    rdma_service_level: Optional[int]
    link_total_time: int
    link_retry_count: int
    def __init__(self) -> None: ...
    @property
    def options(self) -> Dict[str, str]: ...
    def generate_options(self) -> Dict[str, str]:
        """The option dict for :meth:`LLMDataDist.init`."""
    def gen_options(self) -> Dict[str, str]: ...

LlmConfig = LLMConfig

class TransferConfig:
    """A layer-wise destination by address (two per layer)."""
    dst_cluster_id: int
    dst_addrs: List[int]
    src_layer_range: Optional[range]
    src_batch_index: int
    def __init__(self, dst_cluster_id: int, dst_addrs: List[int],
                 src_layer_range: Optional[range] = None, src_batch_index: int = 0) -> None: ...

class TransferWithCacheKeyConfig:
    """A layer-wise destination by key."""
    cache_key: Union[BlocksCacheKey, CacheKeyByIdAndIndex]
    src_layer_range: Optional[range]
    dst_layer_range: Optional[range]
    src_batch_index: int
    def __init__(self, cache_key: Union[BlocksCacheKey, CacheKeyByIdAndIndex],
                 src_layer_range: Optional[range] = None,
                 dst_layer_range: Optional[range] = None, src_batch_index: int = 0) -> None: ...
    @property
    def dst_cluster_id(self) -> int: ...

class LayerSynchronizer:
    """Subclass it: ``synchronize_layer`` is called once per source layer, in order."""
    def synchronize_layer(self, layer_index: int, timeout_in_millis: Optional[int]) -> bool:
        """Waits until the layer is computed; True sends it, False stops the transfer."""

class CacheTask:
    """An asynchronous layer-wise transfer."""
    def synchronize(self, timeout_in_millis: Optional[int] = None) -> LLMStatusCode:
        """The overall status (``LLM_TIMEOUT`` if not finished in time)."""
    def get_results(self, timeout_in_millis: Optional[int] = None) -> List[Optional[LLMStatusCode]]:
        """One status per transfer config."""
    def get_errors(self, timeout_in_millis: Optional[int] = None) -> List[Optional[LLMException]]:
        """hixl extension: the exception of each failed config (with ``failed_blocks``)."""

class LeaseGrant:
    """hixl extension: a lease of blocks, handed from owner to puller as a dict or JSON."""
    owner: int
    lease_id: int
    generation: int
    request_id: int
    caches: List[int]
    blocks: List[int]
    ttl_ms: int
    def __init__(self, owner: int, lease_id: int, generation: int, request_id: int,
                 caches: Sequence[int], blocks: Sequence[int], ttl_ms: int) -> None: ...
    def to_dict(self) -> Dict[str, Any]: ...
    def to_json(self) -> str: ...
    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "LeaseGrant": ...
    @classmethod
    def from_json(cls, s: str) -> "LeaseGrant": ...

class EndedLease(NamedTuple):
    """hixl extension: a lease that ended (``why``: DONE, EXPIRED, LINK_DOWN, REVOKED)."""
    request_id: int
    lease_id: int
    caches: List[int]
    blocks: List[int]
    why: str

_Grant = Union[LeaseGrant, Dict[str, Any], str]

class CacheManager:
    """Registers caches and moves them between clusters."""
    def register_blocks_cache(self, cache_desc: CacheDesc, addrs: Sequence[Union[int, Any]],
                              blocks_cache_key: Optional[BlocksCacheKey] = None,
                              remote_accessible: Optional[bool] = None) -> Cache:
        """Registers a paged cache of caller-owned memory (kept alive until unregistered)."""
    def register_cache(self, cache_desc: CacheDesc, addrs: Sequence[Union[int, Any]],
                       cache_keys: Union[Tuple[CacheKey, ...], List[CacheKey]] = (),
                       remote_accessible: Optional[bool] = None) -> Cache:
        """Registers a contiguous cache; ``cache_keys[i]`` names entry ``i``."""
    def unregister_cache(self, cache_id: int) -> None: ...
    def remove_cache_key(self, cache_key: CacheKey) -> None: ...
    def allocate_cache(self, cache_desc: CacheDesc,
                       cache_keys: Union[Tuple[CacheKey, ...], List[CacheKey]] = ()) -> Cache:
        """Allocates a zeroed contiguous host cache this instance owns."""
    def allocate_blocks_cache(self, cache_desc: CacheDesc,
                              blocks_cache_key: Optional[BlocksCacheKey] = None) -> Cache:
        """Allocates a zeroed blocks host cache this instance owns."""
    def deallocate_cache(self, cache: Cache) -> None:
        """Frees an allocated cache."""
    def deallocate_blocks_cache(self, cache: Cache) -> None:
        """Frees an allocated blocks cache."""
    def remap_registered_memory(self, mem_infos: Union[MemInfo, List[MemInfo]]) -> None:
        """Reserved; not supported."""
    def pull_blocks(self, src_cache_key: Union[CacheKey, CacheKeyByIdAndIndex, BlocksCacheKey],
                    dst_cache: Cache, src_blocks: Optional[Sequence[int]] = (),
                    dst_blocks: Sequence[int] = (), *, src_layer_range: Optional[range] = ...,
                    dst_layer_range: Optional[range] = ...,
                    tensor_num_per_layer: int = ...) -> None:
        """Pulls a peer's blocks into ``dst_cache``."""
    def push_blocks(self, dst_cache_key: BlocksCacheKey, src_cache: Cache,
                    src_blocks: Optional[Sequence[int]] = (), dst_blocks: Sequence[int] = (),
                    src_layer_range: Optional[range] = None,
                    dst_layer_range: Optional[range] = None,
                    tensor_num_per_layer: int = 2) -> None:
        """Pushes blocks of ``src_cache`` into a peer's blocks cache."""
    def pull_cache(self, cache_key: Union[CacheKey, CacheKeyByIdAndIndex], cache: Cache,
                   batch_index: int = 0, size: int = -1, *,
                   src_layer_range: Optional[range] = ..., dst_layer_range: Optional[range] = ...,
                   tensor_num_per_layer: int = ...) -> None:
        """Pulls a peer's batch entry into entry ``batch_index`` of ``cache``."""
    def push_cache(self, dst_cache_key: Union[CacheKeyByIdAndIndex, CacheKey], src_cache: Cache,
                   src_batch_index: int = 0, src_layer_range: Optional[range] = None,
                   dst_layer_range: Optional[range] = None, size: int = -1,
                   tensor_num_per_layer: int = 2) -> None:
        """Pushes a batch entry into a peer's cache."""
    def copy_blocks(self, cache: Cache, copy_block_info: Dict[int, List[int]]) -> None:
        """Copies blocks within ``cache`` (fan-out)."""
    def swap_blocks(self, src_cache: Cache, dst_cache: Cache, src_to_dst: Dict[int, int]) -> None:
        """Copies blocks between two local caches."""
    def transfer_cache_async(
            self, src_cache: Cache, layer_synchronizer: LayerSynchronizer,
            transfer_configs: Union[List[Union[TransferConfig, TransferWithCacheKeyConfig]],
                                    Tuple[Union[TransferConfig, TransferWithCacheKeyConfig], ...]],
            src_block_indices: Optional[Sequence[int]] = None,
            dst_block_indices: Optional[Sequence[int]] = None,
            dst_block_memory_size: Optional[int] = None) -> CacheTask:
        """Pushes ``src_cache`` layer by layer as the synchronizer releases each layer."""
    def lease_blocks(self, request_id: int, caches: Sequence[Cache], blocks: Sequence[int],
                     ttl_ms: int = 30000, lease_id: Optional[int] = None,
                     generation: Optional[int] = None) -> LeaseGrant:
        """hixl extension: leases blocks of a request to the peer that will pull them."""
    def end_lease(self, lease: Union[int, LeaseGrant]) -> None:
        """hixl extension: revokes a lease this cluster granted."""
    def lease_events(self, timeout_in_millis: int = 0) -> List[EndedLease]:
        """hixl extension: the leases that ended since the last call."""
    def live_leases(self) -> int:
        """hixl extension: live leases this cluster granted."""
    def pull_leased_blocks(self, grant: _Grant, src_cache_key: BlocksCacheKey, dst_cache: Cache,
                           src_blocks: Optional[Sequence[int]] = None,
                           dst_blocks: Sequence[int] = (), done: bool = False, *,
                           src_layer_range: Optional[range] = ...,
                           dst_layer_range: Optional[range] = ...,
                           tensor_num_per_layer: int = ...) -> None:
        """hixl extension: pulls leased blocks (refused with LLM_LEASE_ENDED once ended)."""
    def lease_done(self, grant: _Grant) -> None:
        """hixl extension: ends the lease from the puller's side."""
    def renew_lease(self, grant: _Grant) -> None:
        """hixl extension: extends the lease by its TTL."""
    def set_kv_shard(self, cache: Cache, tp_rank: int, tp_size: int, total_heads: int,
                     head_dim: int, layout: str = "NHD", mla: bool = False) -> None:
        """hixl extension: declares the KV heads ``cache`` holds."""
    def pull_kv_blocks_resharded(self, src_cache_keys: Sequence[BlocksCacheKey],
                                 dst_cache: Cache, src_blocks: Sequence[int],
                                 dst_blocks: Sequence[int], *,
                                 src_layer_range: Optional[range] = ...,
                                 dst_layer_range: Optional[range] = ...,
                                 tensor_num_per_layer: int = ...) -> None:
        """hixl extension: pulls blocks from prefill ranks of another TP size."""
    def pull_leased_blocks_resharded(self, grants: Sequence[_Grant],
                                     src_cache_keys: Sequence[BlocksCacheKey], dst_cache: Cache,
                                     src_blocks: Sequence[int], dst_blocks: Sequence[int],
                                     done: bool = True, *,
                                     src_layer_range: Optional[range] = ...,
                                     dst_layer_range: Optional[range] = ...,
                                     tensor_num_per_layer: int = ...) -> None:
        """hixl extension: pulls blocks from prefill ranks of another TP size under their
        leases (``grants[i]`` is the lease of ``src_cache_keys[i]``); a prefill rank's lease
        ends DONE once every decode rank reading it pulled with ``done``."""
    def pull_kv_tokens(self, src_cache_keys: Sequence[BlocksCacheKey], dst_cache: Cache,
                       src_blocks: Sequence[Optional[int]], dst_blocks: Sequence[Optional[int]],
                       tokens: int, *, src_layer_range: Optional[range] = ...,
                       dst_layer_range: Optional[range] = ...,
                       tensor_num_per_layer: int = ...) -> None:
        """hixl extension: pulls a request's tokens by position, whatever each side's tokens
        per block (and TP size)."""
    def pull_leased_kv_tokens(self, grants: Sequence[_Grant],
                              src_cache_keys: Sequence[BlocksCacheKey], dst_cache: Cache,
                              src_blocks: Sequence[Optional[int]],
                              dst_blocks: Sequence[Optional[int]], tokens: int,
                              done: bool = True, *, src_layer_range: Optional[range] = ...,
                              dst_layer_range: Optional[range] = ...,
                              tensor_num_per_layer: int = ...) -> None:
        """hixl extension: :meth:`pull_kv_tokens` under the prefill ranks' leases."""

def plan_token_blocks(src_blocks: Sequence[Optional[int]], dst_blocks: Sequence[Optional[int]],
                      tokens: int, src_block_tokens: int,
                      dst_block_tokens: int) -> Tuple[List[int], List[int]]:
    """hixl extension: ``(landing, missing)`` destination blocks of a token pull."""
def kv_shard_readers(decode_tp: int, prefill_tp: int, total_heads: int,
                     mla: bool = False) -> List[int]:
    """hixl extension: how many decode ranks (of ``decode_tp``) read each prefill rank (of
    ``prefill_tp``) of a model of ``total_heads`` KV heads; 0 for a replica nobody reads."""
def kv_shard_sources(decode_rank: int, decode_tp: int, prefill_tp: int, total_heads: int,
                     mla: bool = False) -> List[int]:
    """hixl extension: the prefill ranks decode rank ``decode_rank`` reads, in plan order."""

class LLMDataDist:
    """One cluster's LLM-DataDist instance."""
    def __init__(self, role: LLMRole, cluster_id: int) -> None: ...
    @property
    def cluster_id(self) -> int: ...
    @property
    def role(self) -> LLMRole: ...
    @property
    def listen_ip_info(self) -> str:
        """hixl extension: the ``ip:port`` this instance listens on."""
    def link_transport(self, cluster_id: int) -> str:
        """hixl extension: the transport of the link to ``cluster_id``."""
    @property
    def cache_manager(self) -> CacheManager: ...
    def init(self, options: Dict[str, str]) -> None:
        """Starts the transfer engine (``llm.listenIpInfo`` is required)."""
    def finalize(self) -> None:
        """Closes every link and stops the engine."""
    def link_clusters(self, clusters: Union[List[LLMClusterInfo], Tuple[LLMClusterInfo, ...]],
                      timeout: int = 3000) -> Tuple[LLMStatusCode, List[LLMStatusCode]]:
        """Links to clusters; overall and per-cluster status."""
    def unlink_clusters(self, clusters: Union[List[LLMClusterInfo], Tuple[LLMClusterInfo, ...]],
                        timeout: int = 3000, force: bool = False
                        ) -> Tuple[LLMStatusCode, List[LLMStatusCode]]:
        """Unlinks clusters; overall and per-cluster status."""
    def switch_role(self, role: LLMRole, switch_options: Optional[Dict[str, str]] = None) -> None:
        """Changes the role label (LLM_EXIST_LINK while linked)."""
    def link(self, comm_name: str, cluster_rank_info: Dict[int, int], rank_table: str) -> int:
        """Not supported (two-sided link)."""
    def unlink(self, comm_id: int) -> None:
        """Not supported (two-sided link)."""
    def query_register_mem_status(self, comm_id: int) -> RegisterMemStatus:
        """Not supported (two-sided link)."""
