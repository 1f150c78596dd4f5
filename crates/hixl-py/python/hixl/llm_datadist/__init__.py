"""``hixl.llm_datadist``: a drop-in for the ``llm_datadist`` Python package (LLM-DataDist), over
hixl's transfer engine.

A script written against ``llm_datadist`` runs with its import line changed to
``from hixl.llm_datadist import ...``. Differences:

* Caches are host memory (``Placement.HOST``): ``Placement.DEVICE`` needs a device runtime and
  is refused with ``LLM_FEATURE_NOT_ENABLED``. Addresses are raw ints (``arr.ctypes.data``,
  ``tensor.data_ptr()``); the caller keeps the memory alive until ``unregister_cache`` or
  ``finalize``, as LLM-DataDist requires (or passes the arrays themselves, which the cache then
  keeps alive: a hixl extension). ``allocate_cache`` / ``allocate_blocks_cache`` need no
  memory-pool option.
* Caches may be registered before or after peers link (LLM-DataDist asks for before; a hixl
  extension): a linked peer's pull or push right after the register call returned waits for
  the new memory table instead of being refused. One memory range belongs to one cache.
* Both sides listen (``listen_ip_info`` is required; port 0 picks a free port, read it back from
  ``LLMDataDist.listen_ip_info``). The transport is chosen with ``hixl.Transport`` in
  ``LLMConfig.ge_options`` (``tcp``, or ``fabric`` between processes of one host).
* hixl extensions, marked so in their docstrings: request-scoped leases
  (``cache_manager.lease_blocks`` / ``pull_leased_blocks`` / ...), per-block failure status
  (``LLMException.failed_blocks``), pulls across tensor-parallel sizes
  (``cache_manager.set_kv_shard`` / ``pull_kv_blocks_resharded`` /
  ``pull_leased_blocks_resharded``, ``kv_shard_sources`` / ``kv_shard_readers``),
  ``LLM_LEASE_ENDED`` and
  ``LLM_LEASE_HELD``, ``CacheTask.get_errors``.
* Not supported (``LLM_FEATURE_NOT_ENABLED``): the two-sided HCCL link (``link``, ``unlink``,
  ``query_register_mem_status``), pulling or pushing between a contiguous cache and blocks,
  ``remap_registered_memory``.

Decode side, pulling a request's blocks from a prefill cluster::

    import numpy as np
    from hixl.llm_datadist import (BlocksCacheKey, CacheDesc, DataType, LLMClusterInfo,
                                   LLMConfig, LLMDataDist, LLMRole, LLMStatusCode, Placement)

    dd = LLMDataDist(LLMRole.DECODER, 1)
    config = LLMConfig()
    config.listen_ip_info = "10.0.0.2:26001"
    config.ge_options = {"hixl.Transport": "tcp"}
    dd.init(config.generate_options())
    kv = [np.zeros((512, 128, 8, 128), np.float16) for _ in range(2 * 32)]  # K, V per layer
    desc = CacheDesc(len(kv), list(kv[0].shape), DataType.DT_FLOAT16, placement=Placement.HOST)
    cache = dd.cache_manager.register_blocks_cache(desc, [a.ctypes.data for a in kv],
                                                   BlocksCacheKey(1))
    prefill = LLMClusterInfo()
    prefill.remote_cluster_id = 0
    prefill.append_remote_ip_info("10.0.0.1", 26000)
    ret, _ = dd.link_clusters([prefill], 5000)
    assert ret == LLMStatusCode.LLM_SUCCESS
    dd.cache_manager.pull_blocks(BlocksCacheKey(0), cache, src_blocks=[7, 8, 9],
                                 dst_blocks=[0, 1, 2])
"""

from ._status import BlockFailure, LLMException, LLMStatusCode
from ._config import LLMClusterInfo, LLMConfig, LlmConfig
from ._types import (BlocksCacheKey, Cache, CacheDesc, CacheKey, CacheKeyByIdAndIndex, CacheTask,
                     DataType, EndedLease, LayerSynchronizer, LeaseGrant, LLMRole, MemInfo,
                     Memtype, Placement, RegisterMemStatus, TransferConfig,
                     TransferWithCacheKeyConfig)
from ._datadist import CacheManager, LLMDataDist
from ._reshard import kv_shard_readers, kv_shard_sources, plan_token_blocks

__all__ = [
    "LLMDataDist", "CacheManager", "LLMRole", "LLMConfig", "LlmConfig", "LLMClusterInfo",
    "LLMStatusCode", "LLMException", "BlockFailure", "CacheDesc", "Cache", "BlocksCacheKey",
    "CacheKey", "CacheKeyByIdAndIndex", "Placement", "DataType", "Memtype", "MemInfo",
    "RegisterMemStatus", "TransferConfig", "TransferWithCacheKeyConfig", "LayerSynchronizer",
    "CacheTask", "LeaseGrant", "EndedLease", "kv_shard_readers", "kv_shard_sources",
    "plan_token_blocks",
]
