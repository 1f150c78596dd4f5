"""The connector: its scheduler half (EngineCore process) and worker half (Worker process).

See the package docstring for what it does; the comments here say why."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
import secrets
import threading
import time
from concurrent.futures import ALL_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Set, Tuple

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
    KVConnectorBase_V1, KVConnectorHandshakeMetadata, KVConnectorMetadata, KVConnectorRole)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (  # type: ignore
    KVConnectorPromMetrics, KVConnectorStats)
from vllm.logger import init_logger  # type: ignore

from ..llm_datadist import (BlocksCacheKey, CacheDesc, DataType, LLMClusterInfo, LLMConfig,
                            LLMDataDist, LLMException, LLMRole, LLMStatusCode, Placement)

# Under "vllm." so that vLLM's logging configuration (handlers, level, format) covers it.
logger = init_logger("vllm.distributed.kv_transfer.hixl")

#: Bumped when the transfer parameters change shape: a decode refuses another version.
PARAMS_VERSION = 1


_TRACE = os.environ.get("HIXL_VLLM_TRACE")


def _trace(what: str, req_id: str) -> None:
    if _TRACE:
        with open(_TRACE, "a") as f:
            f.write(f"{time.time():.6f} {os.getpid()} {what} {req_id}\n")


def _u64_of(req_id: str) -> int:
    """The request id datadist's leases carry: 64 bits of a hash of vLLM's id (the lease's
    own id and generation, not this, keep requests apart)."""
    return int.from_bytes(hashlib.blake2b(req_id.encode(), digest_size=8).digest(), "little")


@dataclasses.dataclass
class HixlHandshakeMetadata(KVConnectorHandshakeMetadata):  # type: ignore[misc]
    """What a worker tells its scheduler at start-up (vLLM carries it): where the worker's
    hixl instance listens and which of its caches holds the KV."""

    host: str
    port: int
    cluster_id: int
    cache_id: int
    num_blocks: int
    block_bytes: int
    tensors: int
    tp_rank: int


class HixlConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One engine step's orders from the scheduler half to the worker half."""

    def __init__(self) -> None:
        #: prefill: leases to create, ``req_id -> [grant dict per TP rank]``
        self.to_lease: Dict[str, List[Dict[str, Any]]] = {}
        #: decode: pulls to start, ``req_id -> (local block ids, transfer params)``
        self.to_recv: Dict[str, Tuple[List[int], Dict[str, Any]]] = {}
        #: decode: leases it will not pull (aborted before the pull, or a full local hit)
        self.to_drop: Dict[str, Dict[str, Any]] = {}


@dataclasses.dataclass
class HixlKVConnectorStats(KVConnectorStats):  # type: ignore[misc]
    """Per-transfer telemetry, one entry per pull, in the units NixlConnector uses (so
    tools reading NIXL's stats read these): seconds, bytes, descriptor counts."""

    KEYS = ("transfer_duration", "post_duration", "bytes_transferred", "num_descriptors",
            "num_failed_transfers", "num_kv_expired_reqs", "transport")

    def __post_init__(self) -> None:
        if not self.data:
            self.reset()

    def reset(self) -> None:
        self.data: Dict[str, List[Any]] = {k: [] for k in self.KEYS}

    def record(self, post_s: float, xfer_s: float, nbytes: int, descs: int,
               transport: str) -> None:
        self.data["post_duration"].append(post_s)
        self.data["transfer_duration"].append(xfer_s)
        self.data["bytes_transferred"].append(nbytes)
        self.data["num_descriptors"].append(descs)
        self.data["transport"].append(transport)

    def aggregate(self, other: "KVConnectorStats") -> "HixlKVConnectorStats":
        if other is not None and not other.is_empty():
            for k, v in other.data.items():
                self.data.setdefault(k, []).extend(v)
        return self

    def reduce(self) -> Dict[str, Any]:
        n = len(self.data["transfer_duration"])
        total = sum(self.data["bytes_transferred"])
        secs = sum(self.data["transfer_duration"])
        return {
            "Num successful transfers": n,
            "Avg xfer time (ms)": round(secs / n * 1e3, 3) if n else 0,
            "Avg post time (ms)": round(sum(self.data["post_duration"]) / n * 1e3, 3) if n else 0,
            "Total MiB": round(total / 2**20, 3),
            "Throughput (MiB/s)": round(total / 2**20 / secs, 1) if secs else 0,
            "Num failed transfers": len(self.data["num_failed_transfers"]),
            "Num expired leases": len(self.data["num_kv_expired_reqs"]),
        }

    def is_empty(self) -> bool:
        return not any(self.data.get(k) for k in self.KEYS)

    def clone_and_reset(self) -> "HixlKVConnectorStats":
        old = copy.copy(self)
        self.reset()
        return old


class HixlPromMetrics(KVConnectorPromMetrics):  # type: ignore[misc]
    """hixl's transfer telemetry as Prometheus metrics inside vLLM (its ``/metrics``): per
    engine, histograms of transfer time, post time (link + lease admission), bytes and
    descriptors per pull, pulls by transport, failed pulls and expired leases."""

    def __init__(self, vllm_config: Any, metric_types: Dict[Any, Any], labelnames: List[str],
                 per_engine_labelvalues: Dict[int, List[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        from vllm.v1.metrics.utils import create_metric_per_engine  # type: ignore

        def hist(name: str, doc: str, buckets: List[float]) -> Dict[int, Any]:
            return dict(create_metric_per_engine(self._histogram_cls(
                name=name, documentation=doc, buckets=buckets, labelnames=labelnames),
                self.per_engine_labelvalues))

        def counter(name: str, doc: str) -> Dict[int, Any]:
            return dict(create_metric_per_engine(self._counter_cls(
                name=name, documentation=doc, labelnames=labelnames),
                self.per_engine_labelvalues))

        secs = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                0.5, 1.0, 5.0]
        self.xfer = hist("vllm:hixl_xfer_time_seconds",
                         "hixl KV pulls: lease admission, READ and landing, per pull", secs)
        self.post = hist("vllm:hixl_post_time_seconds",
                         "hixl KV pulls: from the step that started the pull to its first "
                         "attempt (link set-up, waiting for the lease)", secs)
        self.bytes = hist("vllm:hixl_bytes_transferred", "hixl KV pulls: bytes per pull",
                          [float(2 ** (10 + i)) for i in range(1, 25, 2)])
        self.descs = hist("vllm:hixl_num_descriptors",
                          "hixl KV pulls: descriptors (contiguous runs x tensors) per pull",
                          [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096, 16384])
        self.failed = counter("vllm:hixl_num_failed_transfers",
                              "hixl KV pulls that did not land wholly")
        self.expired = counter("vllm:hixl_num_kv_expired_reqs",
                               "hixl leases that expired with no pull done (prefill side)")
        by_transport = self._counter_cls(
            name="vllm:hixl_transfers_by_transport",
            documentation="hixl KV pulls by the transport of their link",
            labelnames=list(labelnames) + ["transport"])
        self.by_transport = by_transport

    def observe(self, transfer_stats_data: Dict[str, Any], engine_idx: int = 0) -> None:
        d = transfer_stats_data
        for metric, key in ((self.xfer, "transfer_duration"), (self.post, "post_duration"),
                            (self.bytes, "bytes_transferred"), (self.descs, "num_descriptors")):
            for v in d.get(key, ()):
                metric[engine_idx].observe(v)
        for metric, key in ((self.failed, "num_failed_transfers"),
                            (self.expired, "num_kv_expired_reqs")):
            for v in d.get(key, ()):
                metric[engine_idx].inc(v)
        labels = list(self.per_engine_labelvalues.get(engine_idx, []))
        for t in d.get("transport", ()):
            self.by_transport.labels(*labels, str(t)).inc()


class _Pull(NamedTuple):
    """A decode's pull in flight: its result (the local blocks that did not land, and why),
    when it was started, and the local blocks it fills."""

    future: "Future[Tuple[Set[int], Optional[str]]]"
    started: float
    local: List[int]


def _extra(vllm_config: Any) -> Dict[str, Any]:
    kt = vllm_config.kv_transfer_config
    extra = dict(getattr(kt, "kv_connector_extra_config", None) or {})
    known = {"transport", "host", "lease_ms", "lease_wait_ms", "secret", "link_timeout_ms",
             "wait_ms", "host_buffer"}
    unknown = sorted(set(extra) - known)
    if unknown:
        raise ValueError(f"hixl.vllm: unknown kv_connector_extra_config key(s) {unknown}; "
                         f"known: {sorted(known)}")
    t = extra.get("transport", "auto")
    if t not in ("auto", "tcp", "fabric"):
        raise ValueError(f"hixl.vllm: transport = {t!r}: expected auto, tcp or fabric")
    for k, d in (("lease_ms", 30000), ("lease_wait_ms", 2000), ("link_timeout_ms", 5000),
                 ("wait_ms", 5)):
        v = extra.get(k, d)
        lo = 0 if k == "wait_ms" else 1
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"hixl.vllm: {k} = {v!r}: expected an int >= {lo} (ms)")
        extra[k] = v
    extra["transport"] = t
    hb = extra.get("host_buffer")
    if hb is not None and not isinstance(hb, bool):
        raise ValueError(f"hixl.vllm: host_buffer = {hb!r}: expected true or false")
    extra.setdefault("host", os.environ.get("VLLM_HOST_IP") or "127.0.0.1")
    return extra


class HixlConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """hixl's vLLM KV connector. vLLM makes one per process: ``SCHEDULER`` in the EngineCore,
    ``WORKER`` in each Worker; each delegates to its half."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = _extra(vllm_config)
        self._sched: Optional[_Scheduler] = None
        self._worker: Optional[_Worker] = None
        if role == KVConnectorRole.SCHEDULER:
            self._sched = _Scheduler(vllm_config, extra)
        else:
            self._worker = _Worker(vllm_config, kv_cache_config, extra)

    # ---------------------------------------------------------------- scheduler half
    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int) -> Tuple[int, bool]:
        assert self._sched is not None
        return self._sched.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        assert self._sched is not None
        self._sched.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> HixlConnectorMetadata:
        assert self._sched is not None
        return self._sched.build_connector_meta()

    def request_finished(self, request: Any,
                         block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        assert self._sched is not None
        return self._sched.request_finished(request, block_ids)

    def set_xfer_handshake_metadata(self, metadata: Dict[int, Any]) -> None:
        if self._sched is not None:
            self._sched.set_handshake(metadata)

    def has_pending_push_work(self) -> bool:
        return False

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: Dict[Any, Any],
                           labelnames: List[str],
                           per_engine_labelvalues: Dict[int, List[object]]
                           ) -> HixlPromMetrics:
        return HixlPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Dict[str, Any]] = None
                                 ) -> Optional[HixlKVConnectorStats]:
        return HixlKVConnectorStats(data=data) if data is not None else HixlKVConnectorStats()

    # ---------------------------------------------------------------- worker half
    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        assert self._worker is not None
        self._worker.register(kv_caches)

    def set_host_xfer_buffer_ops(self, copy_operation: Any) -> None:
        if self._worker is not None:
            self._worker.copy_blocks = copy_operation

    def get_handshake_metadata(self) -> Optional[HixlHandshakeMetadata]:
        return self._worker.handshake() if self._worker is not None else None

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None and isinstance(connector_metadata, HixlConnectorMetadata):
            self._worker.on_meta(connector_metadata)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        # The pulls started when the step's metadata arrived (bind_connector_metadata), so
        # they overlap this step's forward.
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        pass

    def wait_for_save(self) -> None:
        pass

    def get_finished(self, finished_req_ids: Set[str]
                     ) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        assert self._worker is not None
        return self._worker.finished()

    def get_block_ids_with_load_errors(self) -> Set[int]:
        assert self._worker is not None
        return self._worker.take_load_errors()

    def get_kv_connector_stats(self) -> Optional[HixlKVConnectorStats]:
        if self._worker is None or self._worker.stats.is_empty():
            return None
        return self._worker.stats.clone_and_reset()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()


# ==================================================================== scheduler half
class _Scheduler:
    def __init__(self, vllm_config: Any, extra: Dict[str, Any]) -> None:
        self.engine_id = str(vllm_config.kv_transfer_config.engine_id)
        self.tp_size = int(vllm_config.parallel_config.tensor_parallel_size)
        self.block_size = int(vllm_config.cache_config.block_size)
        self.lease_ms = int(extra["lease_ms"])
        self.ranks: Dict[int, HixlHandshakeMetadata] = {}
        # Lease ids: unique for this scheduler's worker, whose lease table lives as long as
        # this process; generations are random, so a grant from an earlier incarnation of
        # the same ids never matches.
        self.next_lease = 0
        self.to_lease: Dict[str, List[Dict[str, Any]]] = {}
        self.to_recv: Dict[str, Tuple[List[int], Dict[str, Any]]] = {}
        self.to_drop: Dict[str, Dict[str, Any]] = {}

    def set_handshake(self, metadata: Dict[int, Any]) -> None:
        for rank, md in metadata.items():
            if isinstance(md, HixlHandshakeMetadata):
                self.ranks[int(rank)] = md

    @staticmethod
    def _pull_params(params: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        if not params or not params.get("do_remote_prefill"):
            return None
        h = params.get("hixl")
        if not isinstance(h, dict) or h.get("v") != PARAMS_VERSION:
            return None
        return h

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int) -> Tuple[int, bool]:
        h = self._pull_params(request.kv_transfer_params)
        if h is None:
            if request.kv_transfer_params and request.kv_transfer_params.get("do_remote_prefill"):
                logger.warning("hixl: request %s has do_remote_prefill but no hixl transfer "
                               "parameters of version %d: computing its prompt here",
                               request.request_id, PARAMS_VERSION)
            return 0, False
        n = len(request.prompt_token_ids or ()) - num_computed_tokens
        _trace("matched", request.request_id)
        return (n, True) if n > 0 else (0, False)

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        params = request.kv_transfer_params
        h = self._pull_params(params)
        if h is None:
            return
        if num_external_tokens > 0:
            groups = blocks.get_unhashed_block_ids_all_groups()
            local = list(groups[0]) if groups else []
            skip = request.num_computed_tokens // max(1, int(h["block_size"]))
            self.to_recv[request.request_id] = (local, {"hixl": h, "skip": skip})
        else:
            # Everything is here already (a local prefix hit): free the prefill's blocks.
            self.to_drop[request.request_id] = {"hixl": h}
        # One pull per request: this is called again after the load.
        params["do_remote_prefill"] = False

    def request_finished(self, request: Any,
                         block_ids: Any) -> Tuple[bool, Optional[Dict[str, Any]]]:
        params = request.kv_transfer_params
        if not params:
            return False, None
        h = self._pull_params(params)
        if h is not None:
            # A decode request that ends before its pull was scheduled: the prefill's blocks
            # must not wait for the lease to expire.
            self.to_drop[request.request_id] = {"hixl": h}
            params["do_remote_prefill"] = False
            return False, None
        if not params.get("do_remote_decode"):
            return False, None
        from vllm.v1.request import RequestStatus  # type: ignore
        if request.status not in (RequestStatus.FINISHED_LENGTH_CAPPED,
                                  RequestStatus.FINISHED_STOPPED):
            return False, None
        if block_ids and isinstance(block_ids[0], (list, tuple)):
            if len(block_ids) != 1:
                logger.warning("hixl: request %s has %d KV cache groups; hixl.vllm handles "
                               "one: the decode computes its prompt", request.request_id,
                               len(block_ids))
                return False, None
            block_ids = block_ids[0]
        blocks = [int(b) for b in block_ids]
        if not blocks:
            return False, None
        if len(self.ranks) != self.tp_size:
            logger.error("hixl: request %s: the handshake metadata of %d of %d workers is "
                         "missing: the decode computes its prompt", request.request_id,
                         self.tp_size - len(self.ranks), self.tp_size)
            return False, None
        self.next_lease += 1
        gen = secrets.randbits(63) | 1
        rid = _u64_of(request.request_id)
        grants = []
        ranks = []
        for r in range(self.tp_size):
            md = self.ranks[r]
            grants.append({"owner": md.cluster_id, "lease_id": self.next_lease,
                           "generation": gen, "request_id": rid, "caches": [md.cache_id],
                           "blocks": blocks, "ttl_ms": self.lease_ms})
            ranks.append({"host": md.host, "port": md.port, "cluster_id": md.cluster_id,
                          "block_bytes": md.block_bytes, "tensors": md.tensors})
        self.to_lease[request.request_id] = grants
        return True, {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [blocks],
            "remote_engine_id": self.engine_id,
            "remote_request_id": request.request_id,
            "remote_num_tokens": int(request.num_computed_tokens),
            "tp_size": self.tp_size,
            "hixl": {"v": PARAMS_VERSION, "grants": grants, "ranks": ranks,
                     "block_size": self.block_size, "tp_size": self.tp_size},
        }

    def build_connector_meta(self) -> HixlConnectorMetadata:
        meta = HixlConnectorMetadata()
        meta.to_lease, self.to_lease = self.to_lease, {}
        meta.to_recv, self.to_recv = self.to_recv, {}
        meta.to_drop, self.to_drop = self.to_drop, {}
        return meta


# ==================================================================== worker half
class _Worker:
    def __init__(self, vllm_config: Any, kv_cache_config: Any, extra: Dict[str, Any]) -> None:
        self.extra = extra
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        try:
            from vllm.distributed.parallel_state import (  # type: ignore
                get_tensor_model_parallel_rank)
            self.tp_rank = int(get_tensor_model_parallel_rank())
        except Exception:  # not initialised in a single-process test
            self.tp_rank = 0
        self.cluster_id = secrets.randbits(62) + 1
        role = vllm_config.kv_transfer_config.kv_role
        dd_role = {"kv_producer": LLMRole.PROMPT, "kv_consumer": LLMRole.DECODER}.get(
            role, LLMRole.MIX)
        self.dd = LLMDataDist(dd_role, self.cluster_id)
        cfg = LLMConfig()
        cfg.listen_ip_info = f"{extra['host']}:0"
        opts = cfg.generate_options()
        if extra["transport"] != "auto":
            opts["hixl.Transport"] = extra["transport"]
        if extra.get("secret"):
            opts["hixl.AuthSecret"] = str(extra["secret"])
        self.dd.init(opts)
        self.cm = self.dd.cache_manager
        host, _, port = self.dd.listen_ip_info.rpartition(":")
        self.host, self.port = host, int(port)
        self.cache: Any = None
        self.tensors: List[Any] = []
        self.block_bytes = 0
        self.num_blocks = 0
        self.per_layer = 1
        self.n_tensors = 0
        # Host-buffer mode (KV caches on an accelerator): the registered memory is a host copy
        # of the caches' layout, filled from the device before a lease and copied to the
        # device after a pull, with vLLM's block-copy op (`set_host_xfer_buffer_ops`).
        self.device_caches: Optional[Dict[str, Any]] = None
        self.host_caches: Dict[str, Any] = {}
        self.block_dim: Dict[str, int] = {}
        self.copy_blocks: Any = None
        self.lock = threading.Lock()
        #: prefill workers linked to, by cluster id: the transport of the link
        self.transports: Dict[int, str] = {}
        self.link_locks: Dict[int, threading.Lock] = {}
        # Pulls wait mostly on the prefill's answers, so several overlap even on one core.
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="hixl-pull")
        self.pulls: Dict[str, _Pull] = {}
        self.lease_req: Dict[int, str] = {}
        self.sending_done: Set[str] = set()
        self.load_errors: Set[int] = set()
        self.stats = HixlKVConnectorStats()
        self.closed = False

    # -------------------------------------------------------------- start-up
    def register(self, kv_caches: Dict[str, Any]) -> None:
        """Registers the layers' KV tensors as one blocks cache. On vLLM's CPU backend a
        layer is ``(num_blocks, 2, block_size, heads x head_dim)``: block ``b`` is contiguous
        (K then V) at ``b x stride(0)``; a ``(2, num_blocks, ...)`` layer (K and V apart) is
        registered as two tensors."""
        nb = int(self.kv_cache_config.num_blocks)
        addrs: List[int] = []
        block_bytes = None
        per_layer = None
        on_device = sorted({str(t.device) for t in kv_caches.values() if t.device.type != "cpu"})
        staged = self.extra.get("host_buffer")
        if staged is None:
            staged = bool(on_device)
        if on_device and not staged:
            raise RuntimeError(f"hixl.vllm: KV caches on {on_device} with host_buffer = false: "
                               "hixl moves host memory; let it stage through host buffers")
        if staged:
            import torch  # type: ignore  # vLLM's own dependency
            self.device_caches = dict(kv_caches)
            self.host_caches = {name: torch.empty(tuple(t.shape), dtype=t.dtype, device="cpu")
                                for name, t in kv_caches.items()}
            kv_caches = self.host_caches
            logger.info("hixl: host-buffer mode: %d KV tensors%s staged through host memory",
                        len(kv_caches), f" on {on_device}" if on_device else "")
        for name, t in kv_caches.items():
            es = t.element_size()
            if t.shape[0] == nb and t.is_contiguous():
                views = [t]
                self.block_dim[name] = 0
            elif t.dim() >= 2 and t.shape[0] == 2 and t.shape[1] == nb and t[0].is_contiguous():
                views = [t[0], t[1]]
                self.block_dim[name] = 1
            else:
                raise RuntimeError(f"hixl.vllm: KV cache {name} has shape {tuple(t.shape)} "
                                   f"and strides {t.stride()}: no dimension of {nb} blocks "
                                   "with contiguous blocks")
            for v in views:
                bb = int(v.stride(0)) * es
                if block_bytes not in (None, bb) or per_layer not in (None, len(views)):
                    raise RuntimeError(f"hixl.vllm: KV cache {name} differs in layout from "
                                       "the other layers")
                block_bytes, per_layer = bb, len(views)
                addrs.append(int(v.data_ptr()))
            self.tensors.append(t)
        if not addrs or block_bytes is None or per_layer is None:
            raise RuntimeError("hixl.vllm: no KV cache to register")
        desc = CacheDesc(num_tensors=len(addrs), shape=(nb, block_bytes),
                         data_type=DataType.DT_UINT8, placement=Placement.HOST)
        self.cache = self.cm.register_blocks_cache(desc, addrs,
                                                   BlocksCacheKey(self.cluster_id, 0))
        self.block_bytes, self.num_blocks, self.per_layer = block_bytes, nb, per_layer
        self.n_tensors = len(addrs)
        logger.info("hixl: registered %d KV tensors of %d blocks x %d B; listening on %s:%d",
                    len(addrs), nb, block_bytes, self.host, self.port)

    def handshake(self) -> Optional[HixlHandshakeMetadata]:
        if self.cache is None:
            return None
        return HixlHandshakeMetadata(host=self.host, port=self.port, cluster_id=self.cluster_id,
                                     cache_id=int(self.cache.cache_id),
                                     num_blocks=self.num_blocks, block_bytes=self.block_bytes,
                                     tensors=self.n_tensors, tp_rank=self.tp_rank)

    # -------------------------------------------------------------- per step
    def on_meta(self, meta: HixlConnectorMetadata) -> None:
        for req_id, grants in meta.to_lease.items():
            g = grants[self.tp_rank] if self.tp_rank < len(grants) else None
            if g is None or g["owner"] != self.cluster_id:
                logger.error("hixl: lease of request %s names owner %s, this worker is %d: "
                             "its blocks are freed at once", req_id,
                             None if g is None else g["owner"], self.cluster_id)
                self.sending_done.add(req_id)
                continue
            try:
                # The request's KV is complete (its prefill finished last step): in
                # host-buffer mode it goes to the registered host copy before anyone may pull.
                self._stage("d2h", [int(b) for b in g["blocks"]])
                self.cm.lease_blocks(g["request_id"], [self.cache], g["blocks"], g["ttl_ms"],
                                     lease_id=g["lease_id"], generation=g["generation"])
                self.lease_req[int(g["lease_id"])] = req_id
            except Exception as e:  # never out of vLLM's step: this request fails alone
                logger.error("hixl: could not lease the blocks of request %s (%s): they are "
                             "freed at once and the decode's pull will be refused", req_id, e)
                self.sending_done.add(req_id)
        for req_id, (local, p) in meta.to_recv.items():
            _trace("submit", req_id)
            self.pulls[req_id] = _Pull(self.pool.submit(self._pull, req_id, local, p),
                                       time.perf_counter(), list(local))
        for req_id, p in meta.to_drop.items():
            self.pool.submit(self._drop, req_id, p)

    def _rank(self, h: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        if int(h.get("tp_size", 1)) != int(self.vllm_config.parallel_config.tensor_parallel_size):
            raise LLMException(f"the prefill runs tensor-parallel size {h.get('tp_size')}, this "
                               "decode another: hixl.vllm needs the same size",
                               LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
        return h["grants"][self.tp_rank], h["ranks"][self.tp_rank]

    def _link(self, rank: Dict[str, Any]) -> None:
        cid = int(rank["cluster_id"])
        with self.lock:
            if cid in self.transports:
                return
            lk = self.link_locks.setdefault(cid, threading.Lock())
        with lk:
            if cid in self.transports:
                return
            info = LLMClusterInfo()
            info.remote_cluster_id = cid
            info.append_remote_ip_info(str(rank["host"]), int(rank["port"]))
            _, rets = self.dd.link_clusters([info], int(self.extra["link_timeout_ms"]))
            if rets[0] not in (LLMStatusCode.LLM_SUCCESS, LLMStatusCode.LLM_ALREADY_LINK):
                raise LLMException(f"link to prefill worker {rank['host']}:{rank['port']} "
                                   f"(cluster {cid}) failed: {rets[0]!r}", rets[0])
            try:
                how = self.dd.link_transport(cid)
            except LLMException as e:
                how = f"? ({e})"
            self.transports[cid] = how.split()[0]
            logger.info("hixl: linked to prefill worker %s:%s (cluster %d) over %s",
                        rank["host"], rank["port"], cid, how)

    def _pull(self, req_id: str, local: List[int],
              p: Dict[str, Any]) -> Tuple[Set[int], Optional[str]]:
        """Runs on a pool thread (the native calls release the GIL). Returns the local blocks
        that did not land, and why."""
        t0 = time.perf_counter()
        _trace("start", req_id)
        h = p["hixl"]
        try:
            grant, rank = self._rank(h)
            src_all = [int(b) for b in grant["blocks"]]
            skip = int(p.get("skip", 0))
            src = src_all[skip:skip + len(local)]
            dst = local[:len(src)]
            missing = set(local[len(src):])
            self._link(rank)
            if not dst:
                self.cm.lease_done(grant)
                return missing, ("the prefill holds no block for them" if missing else None)
            t1 = self._until_leased(t0, lambda: self.cm.pull_leased_blocks(
                grant, BlocksCacheKey(int(rank["cluster_id"]), 0), self.cache, src_blocks=src,
                dst_blocks=dst, done=True, tensor_num_per_layer=self.per_layer))
            t2 = time.perf_counter()
            _trace("pulled", req_id)
            runs = sum(1 for i, b in enumerate(src)
                       if i == 0 or b != src[i - 1] + 1 or dst[i] != dst[i - 1] + 1)
            with self.lock:
                self.stats.record(t1 - t0, t2 - t1,
                                  len(src) * self.block_bytes * self.n_tensors,
                                  runs * self.n_tensors,
                                  self.transports.get(int(rank["cluster_id"]), "?"))
            return missing, ("the prefill holds fewer blocks" if missing else None)
        except LLMException as e:
            if e.status_code not in (LLMStatusCode.LLM_LEASE_ENDED,
                                     LLMStatusCode.LLM_PARAM_INVALID):
                # The link may be dead (the prefill died or the network broke): the next pull
                # from this prefill links again instead of failing on it.
                self._forget(h)
            failed = {dst_b for (_, _, _, dst_b) in e.failed_blocks} if e.failed_blocks \
                else set(local)
            with self.lock:
                self.stats.data["num_failed_transfers"].append(1)
            return failed, f"{e.status_code.name}: {e}"
        except Exception as e:  # a malformed parameter set: nothing moved
            return set(local), f"{type(e).__name__}: {e}"

    def _until_leased(self, since: float, call: Callable[[], None]) -> float:
        """Runs `call`, again while the prefill refuses it before a byte moved because the
        lease does not exist yet (its worker creates it one step after the grant was handed
        out), for up to ``lease_wait_ms`` after `since`. Returns when the attempt that went
        through started; raises the last refusal or any other error."""
        deadline = since + self.extra["lease_wait_ms"] / 1e3
        while True:
            started = time.perf_counter()
            try:
                call()
                return started
            except LLMException as e:
                if (e.status_code != LLMStatusCode.LLM_LEASE_ENDED or e.failed_blocks
                        or time.perf_counter() >= deadline):
                    raise
            time.sleep(0.001)

    def _forget(self, h: Dict[str, Any]) -> None:
        try:
            rank = h["ranks"][self.tp_rank]
            cid = int(rank["cluster_id"])
        except (KeyError, IndexError, TypeError, ValueError):
            return
        with self.lock:
            if self.transports.pop(cid, None) is None:
                return
        info = LLMClusterInfo()
        info.remote_cluster_id = cid
        info.append_remote_ip_info(str(rank["host"]), int(rank["port"]))
        try:
            self.dd.unlink_clusters([info], 1000, force=True)
        except Exception:  # best effort: the link is being dropped anyway
            pass

    def _drop(self, req_id: str, p: Dict[str, Any]) -> None:
        try:
            grant, rank = self._rank(p["hixl"])
            self._link(rank)
            self._until_leased(time.perf_counter(), lambda: self.cm.lease_done(grant))
        except Exception as e:
            logger.info("hixl: could not tell the prefill that request %s needs its blocks "
                        "no more (%s); its lease expires instead", req_id, e)

    def finished(self) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        sending = self.sending_done
        self.sending_done = set()
        try:
            for ev in self.cm.lease_events(0):
                req_id = self.lease_req.pop(int(ev.lease_id), None)
                if req_id is None:
                    continue
                if ev.why == "EXPIRED":
                    logger.warning("hixl: KV lease expired for request %s: no decode pulled "
                                   "its blocks within the lease; they are freed", req_id)
                    with self.lock:
                        self.stats.data["num_kv_expired_reqs"].append(1)
                sending.add(req_id)
        except LLMException as e:
            logger.error("hixl: lease events: %s", e)
        recving: Set[str] = set()
        # A pull younger than `wait_ms` is waited for here, so that it is reported in the step
        # that started it rather than the next one (a step is ~1 ms or a forward's time);
        # an older one is only polled, so a slow peer cannot stall the other requests.
        now = time.perf_counter()
        budget = self.extra["wait_ms"] / 1e3
        young = [p for p in self.pulls.values()
                 if not p.future.done() and now - p.started < budget]
        if young:
            left = max(p.started for p in young) + budget - now
            wait([p.future for p in young], timeout=max(0.0, left), return_when=ALL_COMPLETED)
        for req_id, pull in list(self.pulls.items()):
            if pull.future.done():
                del self.pulls[req_id]
                local = pull.local
                failed, why = pull.future.result()
                landed = [b for b in local if b not in failed]
                if landed:
                    try:
                        # host-buffer mode: the pulled blocks go to the device before vLLM
                        # is told they are there
                        self._stage("h2d", landed)
                    except Exception as e:  # the device copy failed: nothing is usable
                        failed = set(local)
                        why = f"copying the pulled blocks to the device: {e}"
                if failed:
                    logger.warning("hixl: KV load failure for request %s: blocks %s did not "
                                   "land (%s)", req_id, sorted(failed), why)
                    self.load_errors |= failed
                recving.add(req_id)
                _trace("reported", req_id)
        return (sending or None), (recving or None)

    def _stage(self, direction: str, blocks: List[int]) -> None:
        """Host-buffer mode: copies `blocks` device → host (``d2h``) or host → device
        (``h2d``) with vLLM's block-copy op; no-op otherwise. With ``host_buffer`` forced on
        CPU caches (there is no device: vLLM's CPU platform has no block-copy op) the copy is
        the same indexed copy, done here in torch: the mode's logic runs for real, its device
        copy is the only part a CPU host cannot exercise."""
        if self.device_caches is None or not blocks:
            return
        src, dst = ((self.device_caches, self.host_caches) if direction == "d2h"
                    else (self.host_caches, self.device_caches))
        on_cpu = all(t.device.type == "cpu" for t in self.device_caches.values())
        if not on_cpu:
            if self.copy_blocks is None:
                raise RuntimeError("hixl.vllm: KV caches on a device and no block-copy op "
                                   "(vLLM did not call set_host_xfer_buffer_ops)")
            self.copy_blocks(src, dst, blocks, blocks, direction)
            return
        import torch
        for name, s in src.items():
            d = dst[name]
            dim = self.block_dim[name]
            idx = torch.tensor(blocks, dtype=torch.long)
            d.index_copy_(dim, idx, s.index_select(dim, idx))

    def take_load_errors(self) -> Set[int]:
        e, self.load_errors = self.load_errors, set()
        return e

    def shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.pool.shutdown(wait=True, cancel_futures=True)
        try:
            self.dd.finalize()
        except LLMException:
            pass
