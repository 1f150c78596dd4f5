"""Checks of hixl.vllm that need vLLM itself (run by tools/vllm-e2e.sh with the vLLM venv's
Python; the end-to-end runs cover the rest): the Prometheus metrics are built the way vLLM's
PrometheusStatLogger builds them and expose what the stats hold; stats aggregate and reduce;
bad kv_connector_extra_config values are refused by name. Exit status 0 when all hold."""
import sys

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


def main() -> int:
    from hixl.vllm import HixlConnector, HixlKVConnectorStats
    from hixl.vllm._common import _extra

    # Stats: what a worker records, aggregated the way vLLM's logger does.
    a = HixlKVConnectorStats()
    a.record(0.0001, 0.0005, 262144, 2, "fabric")
    b = HixlKVConnectorStats()
    b.record(0.0002, 0.0015, 524288, 4, "tcp")
    b.data["num_failed_transfers"].append(1)
    a.aggregate(b)
    r = a.reduce()
    assert r["Num successful transfers"] == 2 and r["Num failed transfers"] == 1, r
    assert abs(r["Avg xfer time (ms)"] - 1.0) < 1e-9, r
    rebuilt = HixlConnector.build_kv_connector_stats(dict(a.data))
    assert rebuilt is not None and rebuilt.data == a.data and not rebuilt.is_empty()
    assert HixlKVConnectorStats().is_empty()

    # Prometheus: the metric classes vLLM passes, on a private registry.
    reg = CollectorRegistry()

    def bind(cls):
        class Bound(cls):  # type: ignore[misc, valid-type]
            def __init__(self, *args, **kw):
                kw.setdefault("registry", reg)
                super().__init__(*args, **kw)
        return Bound

    types = {Gauge: bind(Gauge), Counter: bind(Counter), Histogram: bind(Histogram)}

    class Cfg:
        kv_transfer_config = None

    prom = HixlConnector.build_prom_metrics(Cfg(), types, ["model_name", "engine"],
                                            {0: ["tiny", "0"]})
    prom.observe(a.data, 0)
    text = generate_latest(reg).decode()
    want = [
        'vllm:hixl_xfer_time_seconds_count{engine="0",model_name="tiny"} 2.0',
        'vllm:hixl_bytes_transferred_sum{engine="0",model_name="tiny"} 786432.0',
        'vllm:hixl_num_descriptors_sum{engine="0",model_name="tiny"} 6.0',
        'vllm:hixl_num_failed_transfers_total{engine="0",model_name="tiny"} 1.0',
        'vllm:hixl_transfers_by_transport_total{engine="0",model_name="tiny",transport="fabric"} 1.0',
        'vllm:hixl_transfers_by_transport_total{engine="0",model_name="tiny",transport="tcp"} 1.0',
    ]
    missing = [w for w in want if w not in text]
    assert not missing, f"missing from /metrics: {missing}\n{text}"

    # Configuration: a bad key or value is refused, naming it.
    class KT:
        def __init__(self, extra):
            self.kv_connector_extra_config = extra

    class VC:
        def __init__(self, extra):
            self.kv_transfer_config = KT(extra)

    for extra, needle in (({"transprot": "tcp"}, "transprot"), ({"transport": "rdma"}, "rdma"),
                          ({"lease_ms": 0}, "lease_ms"), ({"wait_ms": -1}, "wait_ms"),
                          ({"lease_ms": True}, "lease_ms"), ({"host_buffer": "yes"}, "host_buffer"),
                          ({"port": 65536}, "port = 65536"), ({"host": "pfx"}, "host = 'pfx'"),
                          ({"interface": "nic9"}, "interface = 'nic9'"),
                          ({"directory": "etcd:/x"}, "directory = 'etcd:/x'"),
                          ({"name": "p"}, "needs a directory"),
                          ({"verbs_gid_index": -1}, "verbs_gid_index = -1")):
        try:
            _extra(VC(extra))
        except ValueError as e:
            assert needle in str(e), (extra, e)
        else:
            raise AssertionError(f"{extra} was accepted")
    assert _extra(VC({"wait_ms": 0}))["wait_ms"] == 0
    # The network settings (hixl._netconf, the same names as SGLang's): a named host wins,
    # an interface gives its address, the others pass through checked.
    e = _extra(VC({"host": "192.0.2.7", "port": 27000, "verbs_devices": "rxe0,rxe1",
                   "verbs_gid_index": 1, "directory": "etcd://192.0.2.4:2379", "name": "p"}))
    assert (e["host"], e["port"], e["verbs_devices"], e["verbs_gid_index"]) == (
        "192.0.2.7", 27000, "rxe0,rxe1", 1), e
    assert _extra(VC({"interface": "lo"}))["host"] == "127.0.0.1"
    # Every transport the wheel has is accepted, and a refusal lists them.
    for t in ("auto", "tcp", "fabric", "verbs"):
        assert _extra(VC({"transport": t}))["transport"] == t
    try:
        _extra(VC({"transport": "rdma"}))
    except ValueError as e:
        assert "verbs" in str(e), e
    print("hixl.vllm checks: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
