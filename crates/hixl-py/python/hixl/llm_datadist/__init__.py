"""``hixl.llm_datadist``: a drop-in for the ``llm_datadist`` Python package (LLM-DataDist), over
hixl's transfer engine.

A script written against ``llm_datadist`` runs with its import line changed to
``from hixl.llm_datadist import ...``. Differences:

* Caches are host memory (``Placement.HOST``): ``Placement.DEVICE`` needs a device runtime and
  is refused with ``LLM_FEATURE_NOT_ENABLED``. Addresses are raw ints (``arr.ctypes.data``,
  ``tensor.data_ptr()``); the caller keeps the memory alive until ``unregister_cache`` or
  ``finalize``, as LLM-DataDist requires.
* Both sides listen (``listen_ip_info`` is required; port 0 picks a free port, read it back from
  ``LLMDataDist.listen_ip_info``). The transport is chosen with ``hixl.Transport`` in
  ``LLMConfig.ge_options`` (``tcp``, or ``fabric`` between processes of one host).
* hixl extensions, marked so in their docstrings: request-scoped leases
  (``cache_manager.lease_blocks`` / ``pull_leased_blocks`` / ...), per-block failure status
  (``LLMException.failed_blocks``), pulls across tensor-parallel sizes
  (``cache_manager.set_kv_shard`` / ``pull_kv_blocks_resharded``), ``LLM_LEASE_ENDED`` and
  ``LLM_LEASE_HELD``.
"""

from ._status import BlockFailure, LLMException, LLMStatusCode
from ._types import (BlocksCacheKey, Cache, CacheDesc, CacheKey, CacheKeyByIdAndIndex, CacheTask,
                     DataType, EndedLease, LayerSynchronizer, LeaseGrant, LLMClusterInfo,
                     LLMConfig, LlmConfig, LLMRole, MemInfo, Memtype, Placement,
                     RegisterMemStatus, TransferConfig, TransferWithCacheKeyConfig)
from ._datadist import CacheManager, LLMDataDist

__all__ = [
    "LLMDataDist", "CacheManager", "LLMRole", "LLMConfig", "LlmConfig", "LLMClusterInfo",
    "LLMStatusCode", "LLMException", "BlockFailure", "CacheDesc", "Cache", "BlocksCacheKey",
    "CacheKey", "CacheKeyByIdAndIndex", "Placement", "DataType", "Memtype", "MemInfo",
    "RegisterMemStatus", "TransferConfig", "TransferWithCacheKeyConfig", "LayerSynchronizer",
    "CacheTask", "LeaseGrant", "EndedLease",
]
