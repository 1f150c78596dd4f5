"""The connector's transfer statistics, as vLLM aggregates them and Prometheus shows them."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Dict, List

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (  # type: ignore
    KVConnectorPromMetrics, KVConnectorStats)


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
