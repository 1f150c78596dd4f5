#!/usr/bin/env python3
"""vLLM prefill/decode over HTTP, the way it is deployed: a prefill and a decode OpenAI server
(`python -m vllm.entrypoints.openai.api_server`, what `vllm serve` runs) with hixl's connector,
and `python -m hixl.vllm.proxy` in front; every answer through the proxy is compared token for
token (temperature 0) with a single server's answer to the same request.

    serve_e2e.py --model DIR [--num-prompts 8] [--max-tokens 16] [--extra '{"transport": "tcp"}']
                 [--prefill-tp 1] [--out DIR]

Checks: every answer through the proxy equals the single server's; the decode's own
Prometheus counters say its prompt tokens came from the KV transfer (at most one token per
request computed locally) and hixl's connector moved bytes; no lease expiry or load failure in
a log. The servers run one core each, as bench/vllm/pd_e2e.py pins them (prefill on core 0,
decode and the single server on core 1; a prefill of TP 2 has one rank per core). Exit status
0 when every check holds. Needs the vLLM venv (bench/vllm/setup.sh) with hixl installed."""
import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

BAD_LOG = ("KV lease expired", "KV load failure for request", "could not lease the blocks",
           "refusing to pull", "EngineDeadError")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, body=None, timeout=120):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read().decode()
    return json.loads(raw) if raw.startswith(("{", "[")) else raw


def wait_healthy(name, proc, port, log, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with {proc.returncode}; its log: {log}\n"
                             + open(log).read()[-3000:])
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"{name} did not become healthy in {timeout} s; its log: {log}")


class Servers:
    def __init__(self, out):
        self.out, self.procs = out, []

    def start(self, name, cmd, env_extra, port, timeout=300):
        env = dict(os.environ, **env_extra)
        log = os.path.join(self.out, f"{name}.log")
        proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        self.procs.append((name, proc, log))
        return proc, log, port

    def stop(self, name=None):
        for n, p, _ in self.procs:
            if name in (None, n) and p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for n, p, _ in self.procs:
            if name in (None, n):
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)

    def logs(self):
        return [(n, log) for n, _, log in self.procs]


def vllm_cmd(args, port, kv=None, tp=1):
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
           "--port", str(port), "--skip-tokenizer-init", "--dtype", args.dtype,
           "--max-model-len", "512", "--kv-cache-memory-bytes", str(64 << 20),
           "--max-num-seqs", "8", "--no-enable-prefix-caching"]
    if tp > 1:
        cmd += ["--tensor-parallel-size", str(tp)]
    if kv is not None:
        cmd += ["--kv-transfer-config", json.dumps(kv)]
    return cmd


def complete(port, model, prompt, max_tokens):
    r = http(f"http://127.0.0.1:{port}/v1/completions",
             {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
              "return_token_ids": True, "ignore_eos": True})
    return r["choices"][0]["token_ids"]


def metric(text, name, **labels):
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--extra", default="{}", help="kv_connector_extra_config (JSON)")
    ap.add_argument("--prefill-tp", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="hixl-serve-e2e-")
    os.makedirs(out, exist_ok=True)
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 500) for _ in range(rng.randint(100, 200))]
               for _ in range(args.num_prompts)]
    base = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_HOST_IP": "127.0.0.1"}
    srv = Servers(out)
    checks = {}
    try:
        # The single server's answers first (on the decode's core), then it stops.
        port = free_port()
        p, log, _ = srv.start("single", vllm_cmd(args, port),
                              dict(base, VLLM_CPU_OMP_THREADS_BIND="1"), port)
        wait_healthy("single", p, port, log, 300)
        ref = [complete(port, args.model, pr, args.max_tokens) for pr in prompts]
        srv.stop("single")

        extra = json.loads(args.extra)
        kv = {"kv_connector": "HixlConnector", "kv_connector_module_path": "hixl.vllm",
              "kv_connector_extra_config": extra}
        pp, dp, xp = free_port(), free_port(), free_port()
        p_bind = "0|1" if args.prefill_tp == 2 else "0"
        pre = srv.start("prefill", vllm_cmd(args, pp, dict(kv, kv_role="kv_producer"),
                                            tp=args.prefill_tp),
                        dict(base, VLLM_CPU_OMP_THREADS_BIND=p_bind), pp)
        dec = srv.start("decode", vllm_cmd(args, dp, dict(kv, kv_role="kv_consumer")),
                        dict(base, VLLM_CPU_OMP_THREADS_BIND="1"), dp)
        prox = srv.start("proxy", [sys.executable, "-m", "hixl.vllm.proxy", "--port", str(xp),
                                   "--prefill", f"http://127.0.0.1:{pp}",
                                   "--decode", f"http://127.0.0.1:{dp}"], {}, xp)
        for name, (proc, log, port) in (("prefill", pre), ("decode", dec), ("proxy", prox)):
            wait_healthy(name, proc, port, log, 300)
        t0 = time.perf_counter()
        got = [complete(xp, args.model, pr, args.max_tokens) for pr in prompts]
        wall = time.perf_counter() - t0
        equal = sum(g == r for g, r in zip(got, ref))
        checks["tokens_equal"] = equal == len(prompts)
        m = http(f"http://127.0.0.1:{dp}/metrics")
        moved = metric(m, "vllm:hixl_bytes_transferred_sum")
        sources = {s: metric(m, "vllm:prompt_tokens_by_source_total", source=s)
                   for s in sorted(set(re.findall(r'source="([a-z_]+)"', m)))}
        local = sources.get("local_compute", 0.0)
        checks["decode_prompt_from_transfer"] = local <= len(prompts) and moved > 0
        bad = [(n, b) for n, log in srv.logs() for b in BAD_LOG if b in open(log).read()]
        checks["no_failure_in_logs"] = not bad
        res = {"prompts": len(prompts), "equal": equal, "wall_s": round(wall, 2),
               "hixl_bytes": moved, "decode_prompt_tokens_by_source": sources,
               "bad_log_lines": bad, "checks": checks, "extra": extra,
               "prefill_tp": args.prefill_tp}
        print(json.dumps(res, indent=1))
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(res, f, indent=1)
    finally:
        srv.stop()
    ok = all(checks.values()) and len(checks) == 3
    print(f"serve e2e: {'PASS' if ok else 'FAIL'} ({out})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
