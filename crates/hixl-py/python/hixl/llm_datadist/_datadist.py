"""``LLMDataDist`` and its ``CacheManager``, over hixl's native LLM-DataDist."""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from .. import _hixl
from ._status import LLMException, LLMStatusCode, _check_native_codes, _native_error, \
    _type_error, _value_error
from ._types import (BlocksCacheKey, Cache, CacheDesc, CacheKey, CacheKeyByIdAndIndex, CacheTask,
                     EndedLease, LayerSynchronizer, LeaseGrant, LLMClusterInfo, LLMRole, MemInfo,
                     Placement, RegisterMemStatus, TransferConfig, TransferWithCacheKeyConfig,
                     _grant, _int, _ints, _layer_range, _U32, _INVALID_ID)

__all__ = ["LLMDataDist", "CacheManager"]

_log = logging.getLogger("hixl.llm_datadist")
_check_native_codes(getattr(_hixl, "DATADIST_STATUS_CODES", None))

_MAX_CLUSTERS = 16
_MAX_ADDRS = 240
_S = LLMStatusCode

# Options the native layer takes (besides ``hixl.*`` keys).
_FORWARDED = {"llm.listenIpInfo", "llm.ListenIpInfo", "llm.SyncKvCacheWaitTime", "llm.DeviceId",
              "llm.TransferBackend", "llm.GlobalResourceConfig", "llm.LocalCommRes",
              "llm.BufPoolCfg", "llm.EnableSwitchRole"}
# LLM-DataDist options accepted and not needed by hixl (memory pools, RDMA settings, link
# retries, modes hixl is always in).
_ACCEPTED = {"llm.EnableCacheManager", "llm.EnableRemoteCacheAccessible", "llm.MemPoolConfig",
             "llm.HostMemPoolConfig", "llm.MemoryUtilization", "llm.LinkTotalTime",
             "llm.LinkRetryCount", "llm.RdmaTrafficClass", "llm.RdmaServiceLevel",
             "llm.deployResPath", "llm.OutputMaxSize", "llm.ClusterInfo", "llm.Role",
             "llm.ClusterInfos", "llm.EnableFlowFeedback"}


def _options(options: Dict[str, str]) -> List[Tuple[str, str]]:
    if not isinstance(options, dict):
        raise _type_error(f"options must be a Dict[str, str], got {type(options).__name__}")
    out = []
    for k, v in options.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise _type_error(f"option {k!r} = {v!r}: keys and values must be str")
        if k in _FORWARDED or k.startswith("hixl."):
            if k == "llm.LocalCommRes" and not v:
                continue  # "" means "generate one": hixl needs none
            out.append((k, v))
        elif k in _ACCEPTED or k.startswith("ge."):
            continue
        else:
            raise _value_error(f"unknown option {k!r} = {v!r}")
    return out


class LLMDataDist:
    """One cluster's LLM-DataDist instance (prefill or decode side of disaggregated inference).

    Create it, :meth:`init` it with ``LLMConfig().generate_options()`` (``listen_ip_info`` is
    required: both sides listen), register caches through :attr:`cache_manager`, link to peer
    clusters with :meth:`link_clusters`, pull or push blocks, and :meth:`unlink_clusters` and
    :meth:`finalize` on shutdown.

    Args:
        role: an :class:`LLMRole` (a label: it does not change transfers).
        cluster_id: this cluster's id (peers name its caches by it).
    """

    def __init__(self, role: LLMRole, cluster_id: int) -> None:
        if not isinstance(role, LLMRole):
            raise _type_error(f"role must be an LLMRole, got {role!r}")
        self._role = role
        self._cluster_id = _int("cluster_id", cluster_id)
        self._native = _hixl.DataDist(self._cluster_id, int(role))
        self._state = "new"
        self._cache_manager: Optional[CacheManager] = None
        self._listen: Optional[str] = None

    @property
    def cluster_id(self) -> int:
        """This cluster's id."""
        return self._cluster_id

    @property
    def role(self) -> LLMRole:
        """This cluster's role label."""
        return self._role

    def _check(self) -> None:
        if self._state != "ready":
            why = "was finalized" if self._state == "finalized" else "is not initialized"
            raise LLMException(f"LLMDataDist of cluster {self._cluster_id} {why}: call "
                               "init(options) first", _S.LLM_FAILED)

    def init(self, options: Dict[str, str]) -> None:
        """Starts the transfer engine. A second call is a no-op.

        Options (see :class:`LLMConfig`): ``llm.listenIpInfo`` (``"ip:port"``, required; port
        0 picks a free one, see :attr:`listen_ip_info`), ``llm.SyncKvCacheWaitTime`` (ms),
        ``llm.TransferBackend`` (``"hixl"``), ``llm.GlobalResourceConfig``, and hixl's
        ``hixl.*`` keys (e.g. ``hixl.Transport``: ``tcp`` or ``fabric``). ``ge.*`` keys and
        LLM-DataDist's memory-pool, RDMA and link-retry keys are accepted and unused; an
        unknown key raises ``LLM_PARAM_INVALID`` naming it.
        """
        if self._state == "ready":
            return
        pairs = _options(options)
        self._listen = self._native.init(pairs)
        self._state = "ready"
        self._cache_manager = CacheManager(self)

    def finalize(self) -> None:
        """Closes every link and stops the engine. The caches are unregistered (their memory
        stays the caller's); the :attr:`cache_manager` obtained before is no longer usable."""
        if self._state != "ready":
            return
        if self._cache_manager is not None:
            self._cache_manager._valid = False
        self._state = "finalized"
        self._native.finalize()

    @property
    def listen_ip_info(self) -> str:
        """hixl extension: the ``ip:port`` this instance listens on (the real port when
        ``llm.listenIpInfo`` asked for port 0)."""
        self._check()
        return self._listen or ""

    def link_transport(self, cluster_id: int) -> str:
        """hixl extension: the transport the link to ``cluster_id`` runs over and why, e.g.
        ``"fabric (same host: ...)"`` or ``"tcp (the peer is on another host ...)"``: what
        ``hixl.Transport=auto`` picked, or the forced one. ``LLM_NOT_YET_LINK`` without a
        link."""
        self._check()
        return self._native.link_transport(_int("cluster_id", cluster_id))

    @property
    def cache_manager(self) -> "CacheManager":
        """The :class:`CacheManager` of this instance (after :meth:`init`)."""
        self._check()
        assert self._cache_manager is not None
        return self._cache_manager

    @staticmethod
    def _clusters(clusters: Any) -> List[LLMClusterInfo]:
        if not isinstance(clusters, (list, tuple)):
            raise _type_error(f"clusters must be a list or tuple of LLMClusterInfo, got "
                              f"{type(clusters).__name__}")
        for i, c in enumerate(clusters):
            if not isinstance(c, LLMClusterInfo):
                raise _type_error(f"clusters[{i}] must be an LLMClusterInfo, got {c!r}")
            if c.remote_cluster_id is None:
                raise _value_error(f"clusters[{i}] has no remote_cluster_id")
        return list(clusters)

    @staticmethod
    def _codes(outcomes: List[Tuple[int, str]], clusters: List[LLMClusterInfo],
               what: str) -> Tuple[LLMStatusCode, List[LLMStatusCode]]:
        codes = []
        first = _S.LLM_SUCCESS
        for c, (code, msg) in zip(clusters, outcomes):
            s = LLMStatusCode(code) if code in LLMStatusCode._value2member_map_ else \
                _S.LLM_UNKNOWN_ERROR
            if s != _S.LLM_SUCCESS:
                _log.warning("%s cluster %s: %s (%s)", what, c.remote_cluster_id, msg, s.name)
                if first == _S.LLM_SUCCESS:
                    first = s
            codes.append(s)
        return first, codes

    def link_clusters(self, clusters: Union[List[LLMClusterInfo], Tuple[LLMClusterInfo, ...]],
                      timeout: int = 3000) -> Tuple[LLMStatusCode, List[LLMStatusCode]]:
        """Links to clusters (at most 16 per call): connects to each one's listen address and
        reads its cache table. Returns the overall status (``LLM_SUCCESS`` when every cluster
        linked, else the first failing cluster's code) and one status per cluster:
        ``LLM_ALREADY_LINK``, ``LLM_LINK_FAILED``, ``LLM_TIMEOUT``... Failures are logged on
        the ``hixl.llm_datadist`` logger with their reason.

        Raises:
            LLMException: ``LLM_PARAM_INVALID`` for a bad argument (a timeout ≤ 0, a cluster
                without a remote address), ``LLM_FAILED`` before :meth:`init`.
        """
        self._check()
        timeout = _int("timeout", timeout, 1, 2**31 - 1)
        clusters = self._clusters(clusters)
        if len(clusters) > _MAX_CLUSTERS:
            _log.warning("link_clusters: %d clusters in one call, the limit is %d",
                         len(clusters), _MAX_CLUSTERS)
            return _S.LLM_CLUSTER_NUM_EXCEED_LIMIT, []
        spec = [(c._cluster_id(), c._remote_addr()) for c in clusters]
        outcomes = self._native.link_clusters(spec, timeout)
        return self._codes(outcomes, clusters, "link_clusters")

    def unlink_clusters(self, clusters: Union[List[LLMClusterInfo], Tuple[LLMClusterInfo, ...]],
                        timeout: int = 3000, force: bool = False
                        ) -> Tuple[LLMStatusCode, List[LLMStatusCode]]:
        """Unlinks clusters (at most 16 per call; only ``remote_cluster_id`` is needed).
        Without ``force`` a cluster not linked from this side gives ``LLM_NOT_YET_LINK``; with
        ``force`` only this side is torn down, and a cluster that linked *to* this side (this
        side holds nothing for it) gives ``LLM_SUCCESS``. Returns as :meth:`link_clusters`."""
        self._check()
        timeout = _int("timeout", timeout, 1, 2**31 - 1)
        if not isinstance(force, bool):
            raise _type_error(f"force must be a bool, got {force!r}")
        clusters = self._clusters(clusters)
        if len(clusters) > _MAX_CLUSTERS:
            _log.warning("unlink_clusters: %d clusters in one call, the limit is %d",
                         len(clusters), _MAX_CLUSTERS)
            return _S.LLM_CLUSTER_NUM_EXCEED_LIMIT, []
        ids = [c._cluster_id() for c in clusters]
        outcomes = self._native.unlink_clusters(ids, timeout, force)
        return self._codes(outcomes, clusters, "unlink_clusters")

    def switch_role(self, role: LLMRole, switch_options: Optional[Dict[str, str]] = None) -> None:
        """Changes the role label. Refused with ``LLM_EXIST_LINK`` while links remain. The
        listen address cannot change (``llm.listenIpInfo`` in ``switch_options`` must be the
        current one)."""
        self._check()
        if not isinstance(role, LLMRole):
            raise _type_error(f"role must be an LLMRole, got {role!r}")
        if switch_options is not None:
            if not isinstance(switch_options, dict):
                raise _type_error(f"switch_options must be a dict, got {switch_options!r}")
            listen = switch_options.get("llm.listenIpInfo")
            if listen is not None and listen != self._listen:
                raise LLMException(
                    f"switch_role cannot move the listen address from {self._listen} to "
                    f"{listen!r} (hixl listens where init put it)", _S.LLM_PARAM_INVALID)
        self._native.switch_role(int(role))
        self._role = role

    def link(self, comm_name: str, cluster_rank_info: Dict[int, int], rank_table: str) -> int:
        """The legacy two-sided (HCCL comm-domain) link: not supported by the hixl backend;
        use :meth:`link_clusters`."""
        raise LLMException("link (the two-sided HCCL comm-domain link) is not supported by "
                           "hixl; use link_clusters", _S.LLM_FEATURE_NOT_ENABLED)

    def unlink(self, comm_id: int) -> None:
        """The legacy two-sided unlink: not supported; use :meth:`unlink_clusters`."""
        raise LLMException("unlink (the two-sided HCCL comm-domain unlink) is not supported by "
                           "hixl; use unlink_clusters", _S.LLM_FEATURE_NOT_ENABLED)

    def query_register_mem_status(self, comm_id: int) -> RegisterMemStatus:
        """The legacy two-sided link's registration status: not supported."""
        raise LLMException("query_register_mem_status belongs to the two-sided link, which "
                           "hixl does not support", _S.LLM_FEATURE_NOT_ENABLED)


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


class CacheManager:
    """Registers caches and moves them between clusters (``LLMDataDist.cache_manager``).

    Every method raises :class:`LLMException` on failure; a transfer past ``sync_kv_timeout``
    raises ``LLM_TIMEOUT``, and a block transfer that failed part-way lists the (layer, block)
    pairs that did not land in ``failed_blocks`` (hixl extension).
    """

    def __init__(self, dd: LLMDataDist) -> None:
        self._dd = dd
        self._native = dd._native
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

    # --- registration -------------------------------------------------------------------

    def _register(self, what: str, cache_desc: CacheDesc, addrs: Sequence[Any],
                  key: Optional[Tuple[int, int]], keys: List[Tuple[int, int, int, int]],
                  blocks: bool) -> Cache:
        self._check()
        if not isinstance(cache_desc, CacheDesc):
            raise _type_error(f"cache_desc must be a CacheDesc, got {cache_desc!r}")
        if not isinstance(addrs, (list, tuple)):
            raise _type_error(f"addrs must be a list of ints, got {type(addrs).__name__}")
        keep = [a for a in addrs if not isinstance(a, int)]
        addrs = [_address(i, a, cache_desc.size) for i, a in enumerate(addrs)]
        if not addrs:
            raise _value_error("addrs is empty")
        if len(addrs) > _MAX_ADDRS:
            raise _value_error(f"{len(addrs)} addresses exceed the limit of {_MAX_ADDRS}")
        if len(addrs) != cache_desc.num_tensors:
            raise _value_error(f"{len(addrs)} addresses for num_tensors = "
                               f"{cache_desc.num_tensors}")
        for i, a in enumerate(addrs):
            if a == 0:
                raise _value_error(f"addrs[{i}] is 0")
        if cache_desc.batch_dim_index != 0:
            raise _value_error(f"batch_dim_index {cache_desc.batch_dim_index}: hixl caches "
                               "keep blocks (or batch entries) in dimension 0")
        if cache_desc.placement == Placement.DEVICE:
            raise LLMException(
                f"{what}: placement Placement.DEVICE needs a device runtime (CANN/ACL device "
                "memory), which this build of hixl does not have; register host memory with "
                "CacheDesc(..., placement=Placement.HOST)", _S.LLM_FEATURE_NOT_ENABLED)
        cache_id, taddrs = self._native.register(
            int(cache_desc.placement), cache_desc.num_tensors, cache_desc.data_type.name,
            cache_desc.shape, addrs, key, keys)
        cache = Cache(cache_id, cache_desc, taddrs, blocks, self._native)
        cache._keepalive = keep
        return cache

    def register_blocks_cache(self, cache_desc: CacheDesc, addrs: Sequence[Any],
                              blocks_cache_key: Optional[BlocksCacheKey] = None,
                              remote_accessible: Optional[bool] = None) -> Cache:
        """Registers a paged (blocks) cache whose tensors the caller owns: ``addrs[t]`` is the
        address of tensor ``t`` (``arr.ctypes.data``, ``tensor.data_ptr()``), each
        ``cache_desc.size`` bytes, ``shape[0]`` blocks. Peers pull and push it by
        ``blocks_cache_key`` (``BlocksCacheKey(this cluster, model_id)``) or by its id.

        The memory must stay allocated, and must not move, until :meth:`unregister_cache` or
        ``finalize``: peers read and write it at any time (keep the numpy array or tensor
        referenced). hixl extension: an element of ``addrs`` may be the host array itself (a
        C-contiguous writable numpy array or CPU torch tensor of at least ``cache_desc.size``
        bytes); the returned cache then keeps it alive.

        At most 240 addresses. hixl registers every cache remotely accessible
        (``remote_accessible`` is accepted and ignored) and only host memory
        (``Placement.HOST``). LLM-DataDist requires registering before peers link; hixl
        also takes a cache registered after (a server growing its KV pool): once this call
        returns, a linked peer's pull or push of it waits (up to ``llm.SyncKvCacheWaitTime``)
        for the memory table that reaches it over the link, instead of being refused.
        A memory range belongs to one cache: overlapping an existing cache is refused.
        """
        if blocks_cache_key is not None and not isinstance(blocks_cache_key, BlocksCacheKey):
            raise _type_error(f"blocks_cache_key must be a BlocksCacheKey, got "
                              f"{blocks_cache_key!r}")
        if remote_accessible is not None and not isinstance(remote_accessible, bool):
            raise _type_error(f"remote_accessible must be a bool, got {remote_accessible!r}")
        key = blocks_cache_key._tuple() if blocks_cache_key is not None else None
        return self._register("register_blocks_cache", cache_desc, addrs, key, [], True)

    def register_cache(self, cache_desc: CacheDesc, addrs: Sequence[Any],
                       cache_keys: Union[Tuple[CacheKey, ...], List[CacheKey]] = (),
                       remote_accessible: Optional[bool] = None) -> Cache:
        """Registers a contiguous cache whose tensors the caller owns (``shape[0]`` batch
        entries); ``cache_keys[i]`` names batch entry ``i`` for peers' ``pull_cache`` by
        :class:`CacheKey` (trailing placeholder keys with ``req_id = 2**64-1`` are dropped).
        The memory rules of :meth:`register_blocks_cache` apply."""
        if not isinstance(cache_keys, (list, tuple)):
            raise _type_error(f"cache_keys must be a list or tuple of CacheKey, got "
                              f"{cache_keys!r}")
        keys = []
        for i, k in enumerate(cache_keys):
            if not isinstance(k, CacheKey):
                raise _type_error(f"cache_keys[{i}] must be a CacheKey, got {k!r}")
            keys.append(k)
        while keys and keys[-1].req_id == _INVALID_ID and keys[-1].prefix_id == _INVALID_ID:
            keys.pop()
        for i, k in enumerate(keys):
            if k.req_id == _INVALID_ID and k.prefix_id == _INVALID_ID:
                raise _value_error(f"cache_keys[{i}] is a placeholder key before a real one; "
                                   "hixl needs the keyed entries first")
        if remote_accessible is not None and not isinstance(remote_accessible, bool):
            raise _type_error(f"remote_accessible must be a bool, got {remote_accessible!r}")
        return self._register("register_cache", cache_desc, addrs, None,
                              [k._tuple() for k in keys], False)

    def unregister_cache(self, cache_id: int) -> None:
        """Unregisters a cache (an unknown id is a no-op). Waits for transfers touching it;
        peers that still pull it fail (their ``failed_blocks`` say what did not land). Refused
        with ``LLM_LEASE_HELD`` while a lease covers it."""
        self._check()
        self._native.unregister(_int("cache_id", cache_id, -2**63, 2**63 - 1))

    def remove_cache_key(self, cache_key: CacheKey) -> None:
        """Removes a request key of one of this cluster's contiguous caches: peers pulling by it
        get ``LLM_KV_CACHE_NOT_EXIST`` from then on."""
        self._check()
        if not isinstance(cache_key, CacheKey):
            raise _type_error(f"cache_key must be a CacheKey, got {cache_key!r}")
        self._native.remove_cache_key(cache_key._tuple())

    def _allocate(self, cache_desc: CacheDesc, key: Optional[Tuple[int, int]],
                  keys: List[Tuple[int, int, int, int]], blocks: bool) -> Cache:
        self._check()
        if not isinstance(cache_desc, CacheDesc):
            raise _type_error(f"cache_desc must be a CacheDesc, got {cache_desc!r}")
        if cache_desc.num_tensors > _MAX_ADDRS:
            raise _value_error(f"{cache_desc.num_tensors} tensors exceed the limit of "
                               f"{_MAX_ADDRS}")
        if cache_desc.batch_dim_index != 0:
            raise _value_error(f"batch_dim_index {cache_desc.batch_dim_index}: hixl caches "
                               "keep blocks (or batch entries) in dimension 0")
        if cache_desc.placement == Placement.DEVICE:
            raise LLMException(
                "allocate: placement Placement.DEVICE needs a device runtime (CANN/ACL device "
                "memory), which this build of hixl does not have; allocate host memory with "
                "CacheDesc(..., placement=Placement.HOST)", _S.LLM_FEATURE_NOT_ENABLED)
        cache_id, taddrs = self._native.allocate(cache_desc.num_tensors,
                                                 cache_desc.data_type.name, cache_desc.shape,
                                                 key, keys)
        return Cache(cache_id, cache_desc, taddrs, blocks, self._native)

    def allocate_cache(self, cache_desc: CacheDesc,
                       cache_keys: Union[Tuple[CacheKey, ...], List[CacheKey]] = ()) -> Cache:
        """Allocates a zeroed contiguous host cache this instance owns (``Placement.HOST``;
        with the fabric transport, memory same-host peers map directly), ``cache_keys[i]``
        naming entry ``i`` as in :meth:`register_cache`. Its memory is at
        ``cache.tensor_addrs`` (e.g. ``np.ctypeslib.as_array``) until
        :meth:`deallocate_cache` or ``finalize``; no memory-pool option is needed."""
        if not isinstance(cache_keys, (list, tuple)) or not all(
                isinstance(k, CacheKey) for k in cache_keys):
            raise _type_error(f"cache_keys must be a list of CacheKey, got {cache_keys!r}")
        return self._allocate(cache_desc, None, [k._tuple() for k in cache_keys], False)

    def allocate_blocks_cache(self, cache_desc: CacheDesc,
                              blocks_cache_key: Optional[BlocksCacheKey] = None) -> Cache:
        """Allocates a zeroed blocks host cache this instance owns, under
        ``blocks_cache_key``; see :meth:`allocate_cache`."""
        if blocks_cache_key is not None and not isinstance(blocks_cache_key, BlocksCacheKey):
            raise _type_error(f"blocks_cache_key must be a BlocksCacheKey, got "
                              f"{blocks_cache_key!r}")
        key = blocks_cache_key._tuple() if blocks_cache_key is not None else None
        return self._allocate(cache_desc, key, [], True)

    def deallocate_cache(self, cache: Cache) -> None:
        """Frees a cache :meth:`allocate_cache` made (views of its memory become invalid)."""
        self.unregister_cache(self._registered("cache", cache).cache_id)
        cache._tensor_addrs = []

    def deallocate_blocks_cache(self, cache: Cache) -> None:
        """Frees a cache :meth:`allocate_blocks_cache` made."""
        self.deallocate_cache(cache)

    def remap_registered_memory(self, mem_infos: Union[MemInfo, List[MemInfo]]) -> None:
        """Reserved in LLM-DataDist; not supported."""
        raise LLMException("remap_registered_memory is reserved and not supported",
                           _S.LLM_FEATURE_NOT_ENABLED)

    # --- transfers --------------------------------------------------------------------

    def pull_blocks(self, src_cache_key: Union[CacheKey, CacheKeyByIdAndIndex, BlocksCacheKey],
                    dst_cache: Cache, src_blocks: Optional[Sequence[int]] = (),
                    dst_blocks: Sequence[int] = (), **kwargs: Any) -> None:
        """Pulls blocks ``src_blocks`` of the peer's blocks cache ``src_cache_key`` into blocks
        ``dst_blocks`` of ``dst_cache`` (pairwise; runs contiguous on both sides move as one).

        Keyword arguments: ``src_layer_range`` and ``dst_layer_range`` (``range``, step 1,
        same length; default every layer) and ``tensor_num_per_layer`` (default 2: layer ``L``
        is tensors ``[2L, 2L+2)``).

        Raises:
            LLMException: ``LLM_NOT_YET_LINK``, ``LLM_KV_CACHE_NOT_EXIST``,
                ``LLM_PARAM_INVALID`` (a block past a cache's end, names the pair),
                ``LLM_TIMEOUT``; a partial failure lists ``failed_blocks``.
        """
        self._check()
        ext = _kw("pull_blocks", kwargs)
        dst = self._registered("dst_cache", dst_cache)
        if not dst.is_blocks_cache:
            raise _value_error(f"dst_cache (cache {dst.cache_id}) is not a blocks cache")
        db = _ints("dst_blocks", dst_blocks)
        if not db:
            raise _value_error("dst_blocks is empty")
        if not isinstance(src_cache_key, BlocksCacheKey):
            if isinstance(src_cache_key, (CacheKey, CacheKeyByIdAndIndex)):
                raise LLMException(
                    f"pull_blocks from {src_cache_key!r}: pulling a contiguous cache into "
                    "blocks is not supported by hixl; pull it with pull_cache into a "
                    "contiguous cache", _S.LLM_FEATURE_NOT_ENABLED)
            raise _type_error(f"src_cache_key must be a BlocksCacheKey, CacheKey or "
                              f"CacheKeyByIdAndIndex, got {src_cache_key!r}")
        sb = _ints("src_blocks", src_blocks)
        if not sb:
            raise _value_error("src_blocks is empty")
        self._native.pull_blocks(src_cache_key._tuple(), dst.cache_id, sb, db, ext)

    def push_blocks(self, dst_cache_key: BlocksCacheKey, src_cache: Cache,
                    src_blocks: Optional[Sequence[int]] = (), dst_blocks: Sequence[int] = (),
                    src_layer_range: Optional[range] = None,
                    dst_layer_range: Optional[range] = None,
                    tensor_num_per_layer: int = 2) -> None:
        """Pushes blocks ``src_blocks`` of ``src_cache`` into blocks ``dst_blocks`` of the peer's
        blocks cache ``dst_cache_key``. The layer ranges must be equal. Raises as
        :meth:`pull_blocks`."""
        self._check()
        if not isinstance(dst_cache_key, BlocksCacheKey):
            raise _type_error(f"dst_cache_key must be a BlocksCacheKey, got {dst_cache_key!r}")
        src = self._registered("src_cache", src_cache)
        if not src.is_blocks_cache:
            raise _value_error(f"src_cache (cache {src.cache_id}) is not a blocks cache")
        ext = _ext(src_layer_range, dst_layer_range, tensor_num_per_layer)
        sb, db = _ints("src_blocks", src_blocks), _ints("dst_blocks", dst_blocks)
        if not db:
            raise _value_error("dst_blocks is empty")
        self._native.push_blocks(dst_cache_key._tuple(), src.cache_id, sb, db, ext)

    @staticmethod
    def _size(size: Any, cache: Cache) -> None:
        size = _int("size", size, -1, 2**63 - 1)
        entry = cache.cache_desc.size // cache.cache_desc.batch_size
        if size not in (-1, entry):
            raise _value_error(f"size {size}: hixl moves whole batch entries (size = -1, or "
                               f"{entry} bytes for cache {cache.cache_id})")

    def pull_cache(self, cache_key: Union[CacheKey, CacheKeyByIdAndIndex], cache: Cache,
                   batch_index: int = 0, size: int = -1, **kwargs: Any) -> None:
        """Pulls a batch entry of a peer's contiguous cache, named by :class:`CacheKey` (the
        request key it was registered with; a removed key gives ``LLM_KV_CACHE_NOT_EXIST``) or
        :class:`CacheKeyByIdAndIndex`, into entry ``batch_index`` of ``cache``. Keyword
        arguments as :meth:`pull_blocks`; ``size`` is -1 (the whole entry)."""
        self._check()
        ext = _kw("pull_cache", kwargs)
        dst = self._registered("cache", cache)
        bi = _int("batch_index", batch_index, 0, _U32)
        self._size(size, dst)
        if isinstance(cache_key, CacheKey):
            self._native.pull_cache_key(cache_key._tuple(), dst.cache_id, bi, ext)
        elif isinstance(cache_key, CacheKeyByIdAndIndex):
            self._native.pull_cache_index(cache_key._tuple(), dst.cache_id, bi, ext)
        else:
            raise _type_error(f"cache_key must be a CacheKey or CacheKeyByIdAndIndex, got "
                              f"{cache_key!r}")

    def push_cache(self, dst_cache_key: Union[CacheKeyByIdAndIndex, CacheKey], src_cache: Cache,
                   src_batch_index: int = 0, src_layer_range: Optional[range] = None,
                   dst_layer_range: Optional[range] = None, size: int = -1,
                   tensor_num_per_layer: int = 2) -> None:
        """Pushes batch entry ``src_batch_index`` of ``src_cache`` into the peer's entry
        ``dst_cache_key`` (a :class:`CacheKeyByIdAndIndex`; a :class:`CacheKey` is a hixl
        extension). ``size`` is -1. Raises as :meth:`pull_blocks`."""
        self._check()
        src = self._registered("src_cache", src_cache)
        sbi = _int("src_batch_index", src_batch_index, 0, _U32)
        ext = _ext(src_layer_range, dst_layer_range, tensor_num_per_layer)
        self._size(size, src)
        if isinstance(dst_cache_key, CacheKeyByIdAndIndex):
            self._native.push_cache_index(src.cache_id, dst_cache_key._tuple(), sbi, ext)
        elif isinstance(dst_cache_key, CacheKey):
            self._native.push_cache_key(src.cache_id, dst_cache_key._tuple(), sbi, ext)
        else:
            raise _type_error(f"dst_cache_key must be a CacheKeyByIdAndIndex, got "
                              f"{dst_cache_key!r}")

    def copy_blocks(self, cache: Cache, copy_block_info: Dict[int, List[int]]) -> None:
        """Copies blocks within ``cache``: block ``src`` to every block of
        ``copy_block_info[src]`` (prefix sharing, copy-on-write)."""
        self._check()
        c = self._registered("cache", cache)
        if not isinstance(copy_block_info, dict):
            raise _type_error(f"copy_block_info must be a Dict[int, List[int]], got "
                              f"{copy_block_info!r}")
        src = [_int("copy_block_info key", k) for k in copy_block_info]
        dst = [_ints(f"copy_block_info[{k}]", v) for k, v in copy_block_info.items()]
        self._native.copy_blocks(c.cache_id, c.cache_id, src, dst)

    def swap_blocks(self, src_cache: Cache, dst_cache: Cache, src_to_dst: Dict[int, int]) -> None:
        """Copies blocks ``src -> src_to_dst[src]`` from ``src_cache`` to ``dst_cache`` (same
        block size and tensor count). Either cache may be a :meth:`Cache.create_cpu_cache`
        (host memory the caller owns)."""
        self._check()
        for name, c in (("src_cache", src_cache), ("dst_cache", dst_cache)):
            if not isinstance(c, Cache):
                raise _type_error(f"{name} must be a Cache, got {c!r}")
        if not isinstance(src_to_dst, dict):
            raise _type_error(f"src_to_dst must be a Dict[int, int], got {src_to_dst!r}")
        pairs = [(_int("src_to_dst key", k), _int(f"src_to_dst[{k}]", v))
                 for k, v in src_to_dst.items()]
        sd, dd = src_cache.cache_desc, dst_cache.cache_desc
        s_stride, d_stride = sd.size // sd.batch_size, dd.size // dd.batch_size
        if s_stride != d_stride:
            raise _value_error(f"block sizes differ: {s_stride} bytes in the source, "
                               f"{d_stride} in the destination")
        if sd.num_tensors != dd.num_tensors:
            raise _value_error(f"the source has {sd.num_tensors} tensors, the destination "
                               f"{dd.num_tensors}")
        if src_cache._owner is self._native and dst_cache._owner is self._native:
            self._native.swap_blocks(src_cache.cache_id, dst_cache.cache_id, pairs)
            return
        for s, d in pairs:
            if s >= sd.batch_size or d >= dd.batch_size:
                raise _value_error(f"block pair ({s}, {d}) is past the caches' "
                                   f"{sd.batch_size} / {dd.batch_size} blocks")
        for t, (sa, da) in enumerate(zip(src_cache.tensor_addrs, dst_cache.tensor_addrs)):
            _hixl.dd_check_mapped(sa, sd.size, t)
            _hixl.dd_check_mapped(da, dd.size, t)
        for sa, da in zip(src_cache.tensor_addrs, dst_cache.tensor_addrs):
            for s, d in pairs:
                ctypes.memmove(da + d * d_stride, sa + s * s_stride, s_stride)

    # --- layer-wise transfer ------------------------------------------------------------

    def transfer_cache_async(
            self, src_cache: Cache, layer_synchronizer: LayerSynchronizer,
            transfer_configs: Union[List[Union[TransferConfig, TransferWithCacheKeyConfig]],
                                    Tuple[Union[TransferConfig, TransferWithCacheKeyConfig], ...]],
            src_block_indices: Optional[Sequence[int]] = None,
            dst_block_indices: Optional[Sequence[int]] = None,
            dst_block_memory_size: Optional[int] = None) -> CacheTask:
        """Pushes ``src_cache`` layer by layer to every config's destination, each layer as soon
        as ``layer_synchronizer.synchronize_layer(layer, None)`` returned True; returns a
        :class:`CacheTask` at once. Layer ``l`` moves while the synchronizer waits for layer
        ``l + 1``. With block indices, blocks ``src_block_indices`` go to
        ``dst_block_indices`` of a blocks destination; without, batch entry
        ``src_batch_index`` goes to the destination entry.

        ``synchronize_layer`` runs on the task's own thread; if it returns False (or raises),
        the configs waiting for that layer report ``LLM_PARAM_INVALID`` and the task stops.
        hixl pushes host caches (the real package requires device ones).
        """
        self._check()
        src = self._registered("src_cache", src_cache)
        if not isinstance(layer_synchronizer, LayerSynchronizer) and not callable(
                getattr(layer_synchronizer, "synchronize_layer", None)):
            raise _type_error(f"layer_synchronizer must be a LayerSynchronizer, got "
                              f"{layer_synchronizer!r}")
        if not isinstance(transfer_configs, (list, tuple)) or not transfer_configs:
            raise _type_error("transfer_configs must be a non-empty list of TransferConfig or "
                              "TransferWithCacheKeyConfig")
        sb = _ints("src_block_indices", src_block_indices)
        db = _ints("dst_block_indices", dst_block_indices)
        desc = src.cache_desc
        stride = desc.size // desc.batch_size
        if sb or db:
            if not sb or not db:
                raise LLMException(
                    "transfer_cache_async between a contiguous cache and blocks is not supported "
                    "by hixl: give both src_block_indices and dst_block_indices, or neither",
                    _S.LLM_FEATURE_NOT_ENABLED)
            if len(sb) != len(db):
                raise _value_error(f"{len(sb)} src_block_indices but {len(db)} "
                                   "dst_block_indices")
        if dst_block_memory_size not in (None, 0):
            m = _int("dst_block_memory_size", dst_block_memory_size)
            if not db or m != stride:
                raise _value_error(f"dst_block_memory_size {m}: hixl pushes blocks of the "
                                   f"source's size ({stride} bytes) into blocks of that size")
        if desc.num_tensors % 2:
            raise _value_error(f"cache {src.cache_id} has {desc.num_tensors} tensors: a "
                               "layer-wise transfer needs two per layer")
        num_layers = desc.num_tensors // 2
        specs, plans = [], []
        for i, cfg in enumerate(transfer_configs):
            spec, src_range, dst_start = self._plan(i, cfg, num_layers, sb, db, stride)
            specs.append(spec)
            plans.append((src_range, dst_start))
        task = self._native.layer_task(src.cache_id, specs)
        n = len(specs)
        results: List[Optional[LLMStatusCode]] = [None] * n
        errors: List[Optional[LLMException]] = [None] * n

        def drive() -> None:
            refused: Dict[int, LLMException] = {}
            sent = [0] * n
            try:
                for layer in range(num_layers):
                    to = [j for j in range(n) if plans[j][0].start <= layer < plans[j][0].stop
                          and j not in refused and not task.failed(j)]
                    if not to:
                        continue
                    try:
                        ok = layer_synchronizer.synchronize_layer(layer, None)
                        why = f"synchronize_layer({layer}) returned {ok!r}"
                    except Exception as e:  # the user's code: report it on the configs
                        ok, why = False, f"synchronize_layer({layer}) raised {e!r}"
                    if not ok:
                        for j in to:
                            refused[j] = LLMException(why, _S.LLM_PARAM_INVALID)
                        break
                    for j in to:
                        src_range, dst_start = plans[j]
                        try:
                            if task.send(j, layer, dst_start + layer - src_range.start):
                                sent[j] += 1
                        except LLMException as e:
                            refused.setdefault(j, e)
            finally:
                outcomes = task.wait()
                for j in range(n):
                    if j in refused:
                        errors[j] = refused[j]
                    else:
                        out = outcomes[j]
                        if out is not None:
                            errors[j] = _native_error(*out)
                    err = errors[j]
                    if err is not None:
                        results[j] = err.status_code
                    elif sent[j] == len(plans[j][0]):
                        results[j] = _S.LLM_SUCCESS

        t = threading.Thread(target=drive, name="hixl-transfer-cache", daemon=True)
        t.start()
        return CacheTask(t, n, results, errors)

    def _plan(self, i: int, cfg: Any, num_layers: int, sb: List[int], db: List[int],
              stride: int) -> Tuple[Tuple[Any, ...], range, int]:
        """The native target of config ``i``, its source layers and first destination layer."""
        if not isinstance(cfg, (TransferConfig, TransferWithCacheKeyConfig)):
            raise _type_error(f"transfer_configs[{i}] must be a TransferConfig or "
                              f"TransferWithCacheKeyConfig, got {cfg!r}")
        src_range = cfg.src_layer_range if cfg.src_layer_range is not None \
            else range(0, num_layers)
        if src_range.stop > num_layers:
            raise _value_error(f"transfer_configs[{i}]: src_layer_range {src_range!r} is past "
                               f"the source's {num_layers} layers")
        nl = len(src_range)
        blocks = bool(sb)
        if isinstance(cfg, TransferWithCacheKeyConfig):
            dst_range = cfg.dst_layer_range if cfg.dst_layer_range is not None else src_range
            if len(dst_range) != nl:
                raise _value_error(f"transfer_configs[{i}]: src_layer_range {src_range!r} and "
                                   f"dst_layer_range {dst_range!r} differ in length")
            key = cfg.cache_key
            if isinstance(key, BlocksCacheKey):
                if not blocks:
                    raise _value_error(f"transfer_configs[{i}]: a BlocksCacheKey destination "
                                       "needs src_block_indices and dst_block_indices")
                if dst_range.start == src_range.start:
                    spec = (0, key.cluster_id, key.model_id, 0, sb, db, 0, 2)
                else:
                    cid = self._remote_id_by_key(key)
                    spec = (2, key.cluster_id, cid, 0, sb, db, 0, 2)
            elif blocks:
                spec = (2, key.cluster_id, key.cache_id, 0, sb, db, 0, 2)
            else:
                spec = (1, key.cluster_id, key.cache_id, key.batch_index, [], [],
                        cfg.src_batch_index, 2)
            return spec, src_range, dst_range.start
        # TransferConfig: find the peer's cache holding dst_addrs.
        if len(cfg.dst_addrs) != 2 * nl:
            raise _value_error(f"transfer_configs[{i}]: {len(cfg.dst_addrs)} dst_addrs for "
                               f"{nl} layers (two per layer expected)")
        cid, rkey, t0, entry = self._remote_by_addrs(i, cfg.dst_cluster_id, cfg.dst_addrs)
        if t0 % 2:
            raise _value_error(f"transfer_configs[{i}]: dst_addrs[0] is tensor {t0} of the "
                               "peer's cache, not the first tensor of a layer")
        if blocks:
            if entry != 0:
                raise _value_error(f"transfer_configs[{i}]: with block indices, dst_addrs must "
                                   "be the peer's tensor addresses (offset 0)")
            if rkey is not None and t0 // 2 == src_range.start:
                # same layers on both sides: block runs move as one piece per tensor
                spec = (0, rkey[0], rkey[1], 0, sb, db, 0, 2)
            else:
                spec = (2, cfg.dst_cluster_id, cid, 0, sb, db, 0, 2)
        else:
            spec = (1, cfg.dst_cluster_id, cid, entry, [], [], cfg.src_batch_index, 2)
        return spec, src_range, t0 // 2

    def _remote_id_by_key(self, key: BlocksCacheKey) -> int:
        for cid, k, _nt, _units, _stride, _addrs in self._native.peer_caches(key.cluster_id):
            if k == key._tuple():
                return cid
        raise LLMException(f"blocks cache {key!r} does not exist", _S.LLM_KV_CACHE_NOT_EXIST)

    def _remote_by_addrs(self, i: int, cluster_id: int, dst_addrs: List[int]
                         ) -> Tuple[int, Optional[Tuple[int, int]], int, int]:
        """``(cache_id, key, first tensor, batch entry)`` of the peer's cache ``dst_addrs``
        name."""
        for cid, key, nt, units, stride, addrs in self._native.peer_caches(cluster_id):
            size = units * stride
            a0 = dst_addrs[0]
            for t0, base in enumerate(addrs):
                if not base <= a0 < base + size:
                    continue
                off = a0 - base
                if off % stride:
                    break
                if t0 + len(dst_addrs) > nt:
                    break
                if all(dst_addrs[k] == addrs[t0 + k] + off for k in range(len(dst_addrs))):
                    return cid, key, t0, off // stride
                break
        raise LLMException(f"transfer_configs[{i}]: dst_addrs {[hex(a) for a in dst_addrs[:2]]}"
                           f"... are not the tensors of a cache cluster {cluster_id} registered",
                           _S.LLM_KV_CACHE_NOT_EXIST)

    # --- hixl extensions: leases --------------------------------------------------------

    def lease_blocks(self, request_id: int, caches: Sequence[Cache], blocks: Sequence[int],
                     ttl_ms: int = 30000, lease_id: Optional[int] = None,
                     generation: Optional[int] = None) -> LeaseGrant:
        """hixl extension, on the owner (prefill): leases ``blocks`` (the same block ids in
        each of ``caches``) of request ``request_id`` to the peer that will pull them, for
        ``ttl_ms`` without progress. Hand the grant to that peer (``grant.to_dict()``); its
        :meth:`pull_leased_blocks` calls are checked against the lease before a byte moves.
        Until the lease ends (:meth:`lease_events`) its blocks cannot be leased again,
        overwritten by ``copy_blocks``/``swap_blocks``, or their cache unregistered
        (``LLM_LEASE_HELD``).

        ``lease_id`` and ``generation`` (both or neither, each nonzero) create the lease under
        a grant minted ahead by a coordinator that hands it out before this process runs
        again, as ``hixl.vllm``'s scheduler does: the minter keeps ids unique and generations
        random. Until the lease exists a pull with that grant is refused and moves nothing."""
        self._check()
        if not isinstance(caches, (list, tuple)):
            raise _type_error(f"caches must be a list of Cache, got {caches!r}")
        ids = [self._registered(f"caches[{i}]", c).cache_id for i, c in enumerate(caches)]
        if (lease_id is None) != (generation is None):
            raise _value_error(f"lease_id ({lease_id!r}) and generation ({generation!r}) go "
                               "together")
        minted = None if lease_id is None or generation is None else (
            _int("lease_id", lease_id, 1), _int("generation", generation, 1))
        js = self._native.lease_blocks(_int("request_id", request_id), ids,
                                       _ints("blocks", blocks), _int("ttl_ms", ttl_ms, 1),
                                       minted)
        return LeaseGrant.from_json(js)

    def end_lease(self, lease: Union[int, LeaseGrant]) -> None:
        """hixl extension, on the owner: ends a lease it granted (the request was aborted). No
        new pull of it is admitted (``LLM_LEASE_ENDED``, nothing moves); it is reported ended
        (``REVOKED``) once pulls in flight are done. ``LLM_LEASE_ENDED`` if not live."""
        self._check()
        lid = lease.lease_id if isinstance(lease, LeaseGrant) else _int("lease", lease)
        self._native.end_lease(lid)

    def lease_events(self, timeout_in_millis: int = 0) -> List[EndedLease]:
        """hixl extension, on the owner: the leases that ended since the last call, waiting up
        to ``timeout_in_millis`` for the first. Their blocks may be freed and reused."""
        self._check()
        ms = _int("timeout_in_millis", timeout_in_millis, 0, 2**63 - 1)
        return [EndedLease(*e) for e in self._native.lease_events(ms or None)]

    def live_leases(self) -> int:
        """hixl extension, on the owner: how many leases it granted are live."""
        self._check()
        return self._native.live_leases()

    def pull_leased_blocks(self, grant: Union[LeaseGrant, Dict[str, Any], str],
                           src_cache_key: BlocksCacheKey, dst_cache: Cache,
                           src_blocks: Optional[Sequence[int]] = None,
                           dst_blocks: Sequence[int] = (), done: bool = False,
                           **kwargs: Any) -> None:
        """hixl extension, on the puller (decode): pulls leased blocks ``src_blocks`` (default:
        all the grant's) of the owner's blocks cache into ``dst_blocks`` (default: the same
        ids). The owner admits the pull only while the lease is live (else
        ``LLM_LEASE_ENDED`` and nothing moves) and keeps the blocks unreused until it is done.
        With ``done`` the lease ends after a successful pull. Keyword arguments and partial
        failures as :meth:`pull_blocks`."""
        self._check()
        g = _grant(grant)
        if not isinstance(src_cache_key, BlocksCacheKey):
            raise _type_error(f"src_cache_key must be a BlocksCacheKey, got {src_cache_key!r}")
        dst = self._registered("dst_cache", dst_cache)
        ext = _kw("pull_leased_blocks", kwargs)
        sb = list(g.blocks) if src_blocks is None else _ints("src_blocks", src_blocks)
        db = _ints("dst_blocks", dst_blocks) or list(sb)
        if not isinstance(done, bool):
            raise _type_error(f"done must be a bool, got {done!r}")
        self._native.pull_leased_blocks(g.to_json(), src_cache_key._tuple(), dst.cache_id,
                                        sb, db, ext, done)

    def lease_done(self, grant: Union[LeaseGrant, Dict[str, Any], str]) -> None:
        """hixl extension, on the puller: tells the owner the leased blocks are needed no more
        (the lease ends ``DONE``). ``LLM_LEASE_ENDED`` if not live."""
        self._check()
        self._native.lease_done(_grant(grant).to_json())

    def renew_lease(self, grant: Union[LeaseGrant, Dict[str, Any], str]) -> None:
        """hixl extension, on the puller: extends the lease by its TTL (a heartbeat while the
        blocks are still needed but not pulled yet)."""
        self._check()
        self._native.renew_lease(_grant(grant).to_json())

    # --- hixl extensions: heterogeneous tensor parallelism ------------------------------

    def set_kv_shard(self, cache: Cache, tp_rank: int, tp_size: int, total_heads: int,
                     head_dim: int, layout: str = "NHD", mla: bool = False) -> None:
        """hixl extension: declares which KV heads ``cache`` holds (rank ``tp_rank`` of a TP
        group of ``tp_size`` over ``total_heads`` heads of ``head_dim`` elements). Its shape is
        ``[blocks, tokens, heads, head_dim]`` (``"NHD"``), ``[blocks, heads, tokens, head_dim]``
        (``"HND"``), or ``[blocks, tokens, latent]`` for ``mla``. Peers see it at link time."""
        self._check()
        c = self._registered("cache", cache)
        if not isinstance(layout, str):
            raise _type_error(f"layout must be \"NHD\" or \"HND\", got {layout!r}")
        self._native.set_kv_shard(c.cache_id, _int("tp_rank", tp_rank, 0, _U32),
                                  _int("tp_size", tp_size, 1, _U32),
                                  _int("total_heads", total_heads, 1, _U32),
                                  _int("head_dim", head_dim, 1, _U32), layout, bool(mla))

    def pull_kv_blocks_resharded(self, src_cache_keys: Sequence[BlocksCacheKey], dst_cache: Cache,
                                 src_blocks: Sequence[int], dst_blocks: Sequence[int],
                                 **kwargs: Any) -> None:
        """hixl extension: pulls blocks into ``dst_cache`` (a decode rank's cache with a shard)
        from the prefill ranks' blocks caches ``src_cache_keys`` (one per prefill rank, each
        with a shard of one TP group, all linked): each head comes from a rank that holds it,
        moved straight into this rank's layout. Keyword arguments and failures as
        :meth:`pull_blocks`."""
        self._check()
        if not isinstance(src_cache_keys, (list, tuple)) or not all(
                isinstance(k, BlocksCacheKey) for k in src_cache_keys):
            raise _type_error(f"src_cache_keys must be a list of BlocksCacheKey, got "
                              f"{src_cache_keys!r}")
        dst = self._registered("dst_cache", dst_cache)
        ext = _kw("pull_kv_blocks_resharded", kwargs)
        self._native.pull_resharded([k._tuple() for k in src_cache_keys], dst.cache_id,
                                    _ints("src_blocks", src_blocks),
                                    _ints("dst_blocks", dst_blocks), ext)
