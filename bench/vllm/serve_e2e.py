#!/usr/bin/env python3
"""vLLM prefill/decode over HTTP, the way it is deployed: a prefill and a decode OpenAI server
(`python -m vllm.entrypoints.openai.api_server`, what `vllm serve` runs) with hixl's connector,
and `python -m hixl.vllm.proxy` in front; every answer through the proxy is compared token for
token (temperature 0) with a single server's answer to the same request.

    serve_e2e.py --model DIR [--num-prompts 8] [--max-tokens 16] [--extra '{"transport": "tcp"}']
                 [--prefill-tp 1] [--decode-tp 1] [--connector hixl|nixl] [--pin workers|all]
                 [--expect-groups N] [--out DIR]

Checks: every answer through the proxy equals the single server's (asked after the P/D run,
on its own); the decode's own Prometheus counters say its prompt tokens came from the KV
transfer (at most one token per request computed locally) and hixl's connector moved bytes;
no lease expiry or load failure in a log; every worker still runs where it was bound; with
--expect-groups, the decode ran that many KV cache groups. The servers' workers run one core
each, as bench/vllm/pd_e2e.py pins them (prefill on core 0, decode and the single server on
core 1; a side of TP 2 has one rank per core); with --pin all the API servers, EngineCores, the
proxy and this client are pinned too (else they float). Measured: TTFT, time per output token
and request time as the client sees them through the proxy (medians of the warm requests),
the decode server's own means of the same (its vLLM histograms), and the CPU time of every
thread of each side while the requests ran. Exit status 0 when every check holds. Needs the
vLLM venv (bench/vllm/setup.sh) with hixl installed."""
import argparse
import hashlib
import http.client
import statistics
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
import urllib.error
import urllib.request

BAD_LOG = ("KV lease expired", "KV load failure for request", "could not lease the blocks",
           "refusing to pull", "EngineDeadError")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url, body=None, timeout=120):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read().decode()
    return json.loads(raw) if raw.startswith(("{", "[")) else raw


def wait_healthy(name, proc, port, log, timeout, addr="127.0.0.1"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with {proc.returncode}; its log: {log}\n"
                             + open(log).read()[-3000:])
        try:
            urllib.request.urlopen(f"http://{addr}:{port}/health", timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"{name} did not become healthy in {timeout} s; its log: {log}")


class Servers:
    def __init__(self, out):
        self.out, self.procs = out, []

    def start(self, name, cmd, env_extra, port, timeout=300, cpus=None, netns=None,
              env_drop=()):
        """`cpus`: the CPUs the server's processes start on (its workers then bind where
        VLLM_CPU_OMP_THREADS_BIND says). `netns`: the network namespace (a host of
        tools/hosts.sh's rig) it runs in. `env_drop`: variables it must not inherit."""
        env = dict(os.environ, **env_extra)
        for k in env_drop:
            env.pop(k, None)
        if netns:
            cmd = ["ip", "netns", "exec", netns] + list(cmd)
        log = os.path.join(self.out, f"{name}.log")
        # A process group of its own (to stop it whole), in this session: with the kernel's
        # autogroup scheduling a session per server made the servers sharing a core starve
        # each other's hixl threads for seconds (lease notifies timed out).
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env,
                                process_group=0, preexec_fn=pin)
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


def closed_on_sigterm(log):
    """Whether the server of `log` closed its connector on SIGTERM, or vLLM gave its workers
    no chance: its abort-mode teardown (a shutdown timeout of 0) sometimes force-kills a
    worker in the same instant it signals it ("force killing sub process VLLM::Worker"), and
    then no handler of the worker runs, the connector's included."""
    text = open(log).read()
    return ("hixl: connector shut down, its engine closed" in text
            or "force killing sub process VLLM::Worker" in text)


def vllm_cmd(args, port, kv=None, tp=1, block_size=None, pp=1):
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
           "--port", str(port), "--skip-tokenizer-init", "--dtype", args.dtype,
           "--max-model-len", "512", "--kv-cache-memory-bytes", str(64 << 20),
           "--max-num-seqs", "8", "--no-enable-prefix-caching"]
    if tp > 1:
        cmd += ["--tensor-parallel-size", str(tp)]
    if pp > 1:
        cmd += ["--pipeline-parallel-size", str(pp)]
    if block_size or args.block_size:
        cmd += ["--block-size", str(block_size or args.block_size)]
    if kv is not None:
        cmd += ["--kv-transfer-config", json.dumps(kv)]
    return cmd


def complete(port, model, prompt, max_tokens, addr="127.0.0.1"):
    r = get_json(f"http://{addr}:{port}/v1/completions",
             {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
              "return_token_ids": True, "ignore_eos": True})
    return r["choices"][0]["token_ids"]


def stream(port, model, prompt, max_tokens, addr="127.0.0.1"):
    """The same request streamed: (token ids, seconds to the first token, mean seconds
    between tokens after it, seconds in all)."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "return_token_ids": True, "ignore_eos": True,
                       "stream": True}).encode()
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(addr, port, timeout=120)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise urllib.error.HTTPError("stream", r.status, r.read()[:300].decode(), None, None)
    toks, times = [], []
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ids = json.loads(line[6:])["choices"][0].get("token_ids") or []
        now = time.perf_counter()
        for t in ids:
            toks.append(t)
            times.append(now)
    conn.close()
    total = time.perf_counter() - t0
    if not times:
        return toks, None, None, total
    tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
    return toks, times[0] - t0, tpot, total


def read_stat(path):
    """(comm, the fields after it) of a /proc stat file, or None when it is gone."""
    try:
        with open(path) as f:
            st = f.read()
    except OSError:
        return None
    return st[st.index("(") + 1:st.rindex(")")], st[st.rindex(")") + 2:].split()


def descendants(pid):
    """(pid, comm) of every process under `pid`."""
    kids = {}
    for d in os.listdir("/proc"):
        st = read_stat(f"/proc/{d}/stat") if d.isdigit() else None
        if st is not None:
            kids.setdefault(int(st[1][1]), []).append((int(d), st[0]))
    out, todo = [], [pid]
    while todo:
        for child, comm in kids.get(todo.pop(), []):
            todo.append(child)
            out.append((child, comm))
    return out


def worker_cpus(pid):
    """The CPUs each vLLM worker process under `pid` may run on (its main thread's affinity),
    sorted: what a connector's worker ended on, whatever the binding asked for."""
    cpus = []
    for child, comm in descendants(pid):
        if comm.startswith("VLLM::Worker"):
            try:
                cpus.append(sorted(os.sched_getaffinity(child)))
            except OSError:
                pass
    return sorted(cpus)


def thread_cpu(pid):
    """CPU seconds so far of each thread under `pid` (itself included), summed by
    "process/thread" name."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for proc, comm in [(pid, "root")] + descendants(pid):
        try:
            tids = os.listdir(f"/proc/{proc}/task")
        except OSError:
            continue
        for tid in tids:
            st = read_stat(f"/proc/{proc}/task/{tid}/stat")
            if st is None:
                continue
            name, f = st
            key = f"{comm}/{re.sub(r'[0-9]+$', '#', name)}"
            out[key] = out.get(key, 0.0) + (int(f[11]) + int(f[12])) / tick
    return out


def metric(text, name, **labels):
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def reference(args, prompts, out, srv):
    """A single server's answers to `prompts` (started with `srv` on core 1), kept in
    --reference-cache (else `out`) and reused when the model, dtype, prompts and max tokens
    are the same."""
    key = hashlib.sha256(json.dumps([os.path.abspath(args.model), args.dtype,
                                     args.max_tokens, prompts]).encode()).hexdigest()[:16]
    cached = os.path.join(args.reference_cache or out, f"reference-{key}.json")
    if os.path.exists(cached):
        with open(cached) as f:
            return json.load(f)
    port = free_port()
    p, log, _ = srv.start("single", vllm_cmd(args, port),
                          {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_HOST_IP": "127.0.0.1",
                           "VLLM_CPU_OMP_THREADS_BIND": "1"}, port)
    try:
        wait_healthy("single", p, port, log, 300)
        ref = [complete(port, args.model, pr, args.max_tokens) for pr in prompts]
    finally:
        srv.stop("single")
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    with open(cached, "w") as f:
        json.dump(ref, f)
    return ref


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--block-size", type=int, default=None,
                    help="vLLM's block size (its CPU MLA kernel takes 16 only)")
    ap.add_argument("--prefill-block-size", type=int, default=None, metavar="N",
                    help="the prefill's block size (else --block-size): with "
                         "--decode-block-size, a pull between different block sizes")
    ap.add_argument("--decode-block-size", type=int, default=None, metavar="N")
    ap.add_argument("--extra", default="{}", help="kv_connector_extra_config (JSON)")
    ap.add_argument("--prefill-tp", type=int, choices=[1, 2], default=1)
    ap.add_argument("--decode-tp", type=int, choices=[1, 2], default=1)
    ap.add_argument("--prefill-pp", type=int, choices=[1, 2], default=1,
                    help="the prefill's pipeline-parallel size (each stage's layers pulled "
                         "from it; with --prefill-tp 1 only: two cores)")
    ap.add_argument("--connector", choices=["hixl", "nixl"], default="hixl",
                    help="nixl: vLLM's NixlConnector (bench/vllm/nixl_noprog.py), same setup")
    ap.add_argument("--expect-groups", type=int, default=None, metavar="N",
                    help="fail unless the decode's vLLM ran N KV cache groups (a hybrid "
                         "model with vLLM's hybrid allocator on)")
    ap.add_argument("--pin", choices=["workers", "all"], default="workers",
                    help="workers: only vLLM's workers are bound (one core per rank); all: "
                         "also each server's API server and EngineCore (the prefill's on core "
                         "0, the decode's on core 1), the proxy and this client (core 0)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--reference-cache", default=None, metavar="DIR",
                    help="keep the single server's answers here and reuse them when the "
                         "model, dtype, prompts and max tokens are the same")
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
        extra = json.loads(args.extra)
        p_env, d_env = dict(base), dict(base)
        if args.connector == "hixl":
            kv = {"kv_connector": "HixlConnector", "kv_connector_module_path": "hixl.vllm",
                  "kv_connector_extra_config": extra}
        else:  # vLLM's NixlConnector without NIXL's spinning progress thread, UCX over tcp
            kv = {"kv_connector": "NixlNoProgConnector", "kv_connector_module_path": "nixl_noprog",
                  "kv_connector_extra_config": extra}
            here = os.path.dirname(os.path.abspath(__file__))
            nixl = {"PYTHONPATH": here + os.pathsep + os.environ.get("PYTHONPATH", ""),
                    "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "UCX_TLS": "tcp",
                    "UCX_NET_DEVICES": "lo"}
            p_env.update(nixl, VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port()))
            d_env.update(nixl, VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port()))
        pp, dp, xp = free_port(), free_port(), free_port()
        # One core per rank: the prefill from core 0, the decode from core 1 (a TP 2 side
        # takes both).
        bind = {"prefill": {1: "0", 2: "0|1"}[args.prefill_tp * args.prefill_pp],
                "decode": {1: "1", 2: "1|0"}[args.decode_tp]}
        cpus = {"prefill": {0}, "decode": {1}, "proxy": {0}} if args.pin == "all" else {}
        if args.pin == "all":
            os.sched_setaffinity(0, {0})
        pre = srv.start("prefill", vllm_cmd(args, pp, dict(kv, kv_role="kv_producer"),
                                            tp=args.prefill_tp,
                                            block_size=args.prefill_block_size,
                                            pp=args.prefill_pp),
                        dict(p_env, VLLM_CPU_OMP_THREADS_BIND=bind["prefill"]), pp,
                        cpus=cpus.get("prefill"))
        dec = srv.start("decode", vllm_cmd(args, dp, dict(kv, kv_role="kv_consumer"),
                                           tp=args.decode_tp,
                                           block_size=args.decode_block_size),
                        dict(d_env, VLLM_CPU_OMP_THREADS_BIND=bind["decode"]), dp,
                        cpus=cpus.get("decode"))
        prox = srv.start("proxy", [sys.executable, "-m", "hixl.vllm.proxy", "--port", str(xp),
                                   "--prefill", f"http://127.0.0.1:{pp}",
                                   "--decode", f"http://127.0.0.1:{dp}"], {}, xp,
                         cpus=cpus.get("proxy"))
        for name, (proc, log, port) in (("prefill", pre), ("decode", dec), ("proxy", prox)):
            wait_healthy(name, proc, port, log, 300)
        roots = {"prefill": pre[0].pid, "decode": dec[0].pid}
        cpu0 = {side: thread_cpu(pid) for side, pid in roots.items()}
        t0 = time.perf_counter()
        got, lat, ttft, tpot = [], [], [], []
        dm0 = None
        for i, pr in enumerate(prompts):
            if i == 1:  # the decode's own histograms from here on: the warm requests only
                dm0 = get_json(f"http://127.0.0.1:{dp}/metrics")
            try:
                toks, first, per, total = stream(xp, args.model, pr, args.max_tokens)
                got.append(toks)
                lat.append(total)
                if first is not None:
                    ttft.append(first)
                if per is not None:
                    tpot.append(per)
            except urllib.error.HTTPError as e:  # counted as unequal; the logs say why
                got.append(f"HTTP {e.code}: {e.msg}")
        wall = time.perf_counter() - t0
        # Where the CPU went while the requests ran: the threads of each side that used
        # 1 % of the wall time or more.
        cpu_ms = {}
        for side, pid in roots.items():
            now = thread_cpu(pid)
            d = {k: round((v - cpu0[side].get(k, 0.0)) * 1e3) for k, v in now.items()}
            cpu_ms[side] = dict(sorted(((k, v) for k, v in d.items() if v >= wall * 10),
                                       key=lambda kv: -kv[1]))
        m = get_json(f"http://127.0.0.1:{dp}/metrics")

        def d_mean_ms(name):
            """The decode server's own mean of histogram `name` over the warm requests."""
            if dm0 is None:
                return None
            n = metric(m, name + "_count") - metric(dm0, name + "_count")
            t = metric(m, name + "_sum") - metric(dm0, name + "_sum")
            return round(t / n * 1e3, 2) if n > 0 else None

        decode_side = {"d_ttft_ms": d_mean_ms("vllm:time_to_first_token_seconds"),
                       "d_total_ms": d_mean_ms("vllm:e2e_request_latency_seconds"),
                       "d_tpot_ms": d_mean_ms("vllm:inter_token_latency_seconds")}
        moved = metric(m, "vllm:hixl_bytes_transferred_sum")
        sources = {s: metric(m, "vllm:prompt_tokens_by_source_total", source=s)
                   for s in sorted(set(re.findall(r'source="([a-z_]+)"', m)))}
        local = sources.get("local_compute", 0.0)
        checks["decode_prompt_from_transfer"] = (
            local <= len(prompts) and sources.get("external_kv_transfer", 0) > 0
            and (moved > 0 or args.connector != "hixl"))
        # Each worker where its binding put it, with either connector (vLLM's NixlConnector
        # moves its workers to the last core unless nixl_noprog.py puts them back).
        placed = {"prefill": worker_cpus(pre[0].pid), "decode": worker_cpus(dec[0].pid)}
        checks["workers_where_bound"] = all(
            placed[side] == sorted([int(c)] for c in bind[side].split("|")) for side in bind)
        if args.expect_groups is not None:
            # vLLM's own line: "kv cache group sizes (128, 128)", one size per group.
            sizes = re.findall(r"kv cache group sizes \(([^)]*)\)", open(dec[1]).read())
            groups = len([x for x in sizes[-1].split(",") if x.strip()]) if sizes else 0
            checks["kv_cache_groups"] = groups == args.expect_groups
        bad = [(n, b) for n, log in srv.logs() for b in BAD_LOG if b in open(log).read()]
        checks["no_failure_in_logs"] = not bad
        # Stopped as an operator does (SIGTERM to each server's group): vLLM's shutdown path
        # closes the connector's engine in both servers.
        srv.stop()
        checks["connector_closed_on_sigterm"] = args.connector != "hixl" or all(
            closed_on_sigterm(log) for n, log in srv.logs() if n in ("prefill", "decode"))
        # Then a single server's answers to the same requests (on the decode's core).
        ref = reference(args, prompts, out, srv)
        equal = sum(g == r for g, r in zip(got, ref))
        checks["tokens_equal"] = equal == len(prompts)
        def ms(xs):
            return round(statistics.median(xs) * 1e3, 2) if xs else None

        # The first request links the connector (cold); the medians are of the others.
        res = {"connector": args.connector, "pin": args.pin, "prefill_tp": args.prefill_tp,
           "prefill_pp": args.prefill_pp,
               "decode_tp": args.decode_tp, "prompts": len(prompts), "equal": equal,
               "block_sizes": [args.prefill_block_size or args.block_size,
                               args.decode_block_size or args.block_size],
               "wall_s": round(wall, 2), "cold_ttft_ms": ms(ttft[:1]),
               "ttft_ms": ms(ttft[1:]), "tpot_ms": ms(tpot[1:]), "total_ms": ms(lat[1:]),
               "tpot_each_ms": [round(x * 1e3, 2) for x in tpot],
               # the decode server's own means (its vLLM histograms), warm requests
               **decode_side,
               "unequal": [{"request": i, "got": g, "single": r}
                           for i, (g, r) in enumerate(zip(got, ref)) if g != r],
               "hixl_bytes": moved, "decode_prompt_tokens_by_source": sources,
               "worker_cpus": placed, "cpu_ms": cpu_ms, "bad_log_lines": bad, "checks": checks, "extra": extra}
        print(json.dumps(res, indent=1))
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(res, f, indent=1)
    finally:
        srv.stop()
    ok = all(checks.values()) and len(checks) == 5 + (args.expect_groups is not None)
    print(f"serve e2e: {'PASS' if ok else 'FAIL'} ({out})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
