"""``LLMDataDist`` and its ``CacheManager``, over hixl's native LLM-DataDist."""

from __future__ import annotations

import ctypes
import logging
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from .. import _hixl
from ._status import LLMException, LLMStatusCode, _check_native_codes, _type_error, _value_error
from ._config import LLMClusterInfo
from ._exit import track
from ._types import (BlocksCacheKey, Cache, CacheDesc, CacheKey, CacheKeyByIdAndIndex, LLMRole,
                     MemInfo, Placement, RegisterMemStatus, _int, _ints, _U32, _INVALID_ID)
from ._layerwise import _Layerwise
from ._leases import _Leases
from ._manager import _address, _ext, _kw
from ._reshard import _Reshard

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
        track(self)

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


class CacheManager(_Leases, _Reshard, _Layerwise):
    """Registers caches and moves them between clusters (``LLMDataDist.cache_manager``).

    Every method raises :class:`LLMException` on failure; a transfer past ``sync_kv_timeout``
    raises ``LLM_TIMEOUT``, and a block transfer that failed part-way lists the (layer, block)
    pairs that did not land in ``failed_blocks`` (hixl extension).
    """
    def __init__(self, dd: LLMDataDist) -> None:
        super().__init__(dd._native)
        self._dd = dd

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
