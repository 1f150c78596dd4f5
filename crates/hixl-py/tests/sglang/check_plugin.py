"""hixl.sglang as SGLang loads it (SGLang 0.5.23 installed, no SGLang file changed): the wheel's
entry point in SGLang's plugin group, ``load_plugins()`` as ``python -m sglang.launch_server``
runs it before parsing, ``--disaggregation-transfer-backend hixl`` accepted by SGLang's own
argument parser, ``TransferBackend("hixl")`` and ``get_kv_class`` yielding hixl's classes
(also in modules that imported them before the plugin ran), and a device KV pool refused
with a message naming the device. Exit status 0 when every check holds."""

from __future__ import annotations

import json
import sys
import tempfile
from importlib.metadata import entry_points
from pathlib import Path


def main() -> int:
    # imported before the plugin runs, as SGLang's scheduler modules are
    from sglang.srt.disaggregation import prefill as prefill_mod

    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "hixl"]
    assert eps and eps[0].value == "hixl.sglang:register", eps
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.disaggregation.utils import KVClassType, TransferBackend, get_kv_class
    from sglang.srt.server_args import prepare_server_args

    model = Path(tempfile.mkdtemp())
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8,
        "num_hidden_layers": 2, "vocab_size": 1024, "torch_dtype": "bfloat16"}))
    sa = prepare_server_args(["--model-path", str(model), "--device", "cpu",
                              "--disaggregation-mode", "prefill",
                              "--disaggregation-transfer-backend", "hixl"])
    assert sa.disaggregation_transfer_backend == "hixl", sa.disaggregation_transfer_backend
    backend = TransferBackend("hixl")
    from hixl.sglang import _conn

    want = {KVClassType.MANAGER: _conn.HixlKVManager, KVClassType.SENDER: _conn.HixlKVSender,
            KVClassType.RECEIVER: _conn.HixlKVReceiver,
            KVClassType.BOOTSTRAP_SERVER: _conn.HixlKVBootstrapServer}
    for kind, cls in want.items():
        assert get_kv_class(backend, kind) is cls, (kind, get_kv_class(backend, kind))
        # prefill.py imported get_kv_class and TransferBackend before the plugin ran
        assert prefill_mod.get_kv_class(prefill_mod.TransferBackend("hixl"), kind) is cls
    # the other backends are untouched
    assert get_kv_class(TransferBackend("fake"), KVClassType.SENDER).__name__ == "FakeKVSender"
    from sglang.srt.disaggregation.common.conn import CommonKVBootstrapServer

    assert issubclass(_conn.HixlKVBootstrapServer, CommonKVBootstrapServer)
    # a device KV pool is refused, naming the device
    try:
        _conn.check_host_memory(type("Args", (), {"device": "cuda"})())
    except ValueError as e:
        assert "'cuda'" in str(e) and "host memory" in str(e), e
    else:
        raise AssertionError("a cuda KV pool was accepted")
    _conn.check_host_memory(sa)
    print("hixl.sglang: entry point, argument, TransferBackend, get_kv_class, device refusal: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
