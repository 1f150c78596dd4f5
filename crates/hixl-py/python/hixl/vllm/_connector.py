"""The connector: its scheduler half (EngineCore process) and worker half (Worker process).

See the package docstring for what it does; the comments here say why."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
    KVConnectorBase_V1, KVConnectorRole, KVConnectorTransferResults, SupportsHMA)

from ._common import PARAMS_VERSION, HixlConnectorMetadata, HixlHandshakeMetadata, _extra
from ._scheduler import _Scheduler
from ._stats import HixlKVConnectorStats, HixlPromMetrics
from ._worker import _Worker

__all__ = ["HixlConnector", "HixlConnectorMetadata", "HixlHandshakeMetadata",
           "HixlKVConnectorStats", "HixlPromMetrics", "PARAMS_VERSION"]


class HixlConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]
    """hixl's vLLM KV connector. vLLM makes one per process: ``SCHEDULER`` in the EngineCore,
    ``WORKER`` in each Worker; each delegates to its half.

    It supports vLLM's hybrid memory allocator (``SupportsHMA``): a hybrid model's groups
    (full attention, sliding window) are pulled group by group, each decode block from the
    prefill's block at the same position of the request, and a failed pull is reported per
    request (block ids are per group)."""

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

    def request_finished_all_groups(self, request: Any, block_ids: Tuple[List[int], ...]
                                    ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        assert self._sched is not None
        return self._sched.request_finished(request, block_ids)

    def set_xfer_handshake_metadata(self, metadata: Dict[int, Any]) -> None:
        if self._sched is not None:
            self._sched.set_handshake(metadata)

    def set_xfer_handshake_metadata_pp_aware(self, metadata: Dict[Tuple[int, int], Any]
                                             ) -> None:
        """Every worker's metadata by (PP stage, TP rank): a prefill of several stages hands
        each stage's ranks to the decode, which pulls each layer from its stage."""
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

    def get_transfer_results(self, finished_req_ids: Set[str]) -> Any:
        assert self._worker is not None
        sending, recving = self._worker.finished()
        return KVConnectorTransferResults(finished_sending=set(sending or ()),
                                          finished_recving=set(recving or ()),
                                          failed_recving=self._worker.take_failed_reqs())

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
