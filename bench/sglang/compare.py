#!/usr/bin/env python3
"""hixl (tcp, fabric) against SGLang's Mooncake backend (mooncake_tcp) through the same harness
(pd_harness.py), runs alternating backend by backend, then the medians of each case: per-request
transfer time p50 / p99 (the prefill's ``send`` to ``Success``) and throughput (KV bytes over
the run's wall time). Prints a Markdown table and writes every run's summary as JSON.

    compare.py [--models llama-3.1-8b,llama-3.1-70b] [--runs 3] [--requests 64]
               [--tokens 1024] [--out compare.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BACKENDS = [("hixl", "tcp"), ("hixl", "fabric"), ("mooncake_tcp", "")]
#: KV pool tokens per rank for a window of 4 requests of up to 1.5 x tokens
POOL = {"llama-3.1-8b": 12288, "llama-3.1-70b": 8192, "deepseek-r1": 12288}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="llama-3.1-8b,llama-3.1-70b")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--out", default="compare.json")
    a = p.parse_args()
    runs = []
    for model in a.models.split(","):
        for i in range(a.runs):
            for backend, transport in BACKENDS:
                with tempfile.NamedTemporaryFile(suffix=".json") as f:
                    cmd = [sys.executable, str(HERE / "pd_harness.py"), "--backend", backend,
                           "--model", model, "--requests", str(a.requests), "--tokens",
                           str(a.tokens), "--window", str(a.window), "--pool-tokens",
                           str(POOL.get(model, 8192)), "--chunks", "1", "--no-verify",
                           "--json", f.name]
                    if transport:
                        cmd += ["--transport", transport]
                    env = dict(os.environ)
                    # Mooncake's TCP transport rejects a transfer once 1024 are queued for a
                    # peer ("TCP lane queue-full"), and SGLang then fails the session for good;
                    # a layer-by-layer KV send of a real model queues more than that
                    env.setdefault("MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER", "16384")
                    rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, env=env).returncode
                    s = json.loads(Path(f.name).read_text() or "{}")
                s["rc"], s["run"] = rc, i
                runs.append(s)
                print(f"{model} run {i} {backend} {transport}: rc={rc} p50={s.get('p50_ms', 0):.2f}"
                      f" p99={s.get('p99_ms', 0):.2f} ms {s.get('gbps', 0):.3f} GB/s",
                      file=sys.stderr, flush=True)
    Path(a.out).write_text(json.dumps(runs, indent=1))
    print("| model | backend | p50 ms | p99 ms | GB/s | runs (p50 / p99 / GB/s) |")
    print("|---|---|---|---|---|---|")
    for model in a.models.split(","):
        for backend, transport in BACKENDS:
            rs = [r for r in runs if r.get("model") == model and r.get("backend") == backend
                  and r.get("transport") == (transport or "auto") and r["rc"] == 0]
            if not rs:
                print(f"| {model} | {backend} {transport} | failed | | | |")
                continue
            med = {k: statistics.median(r[k] for r in rs) for k in ("p50_ms", "p99_ms", "gbps")}
            each = ", ".join(f"{r['p50_ms']:.1f}/{r['p99_ms']:.1f}/{r['gbps']:.2f}" for r in rs)
            print(f"| {model} | {backend} {transport} | {med['p50_ms']:.1f} | "
                  f"{med['p99_ms']:.1f} | {med['gbps']:.2f} | {each} |")
    return 0 if all(r["rc"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
