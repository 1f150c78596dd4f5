#!/usr/bin/env python3
"""vLLM prefill/decode (P/D) disaggregation, end to end, on one CPU-only host.

Three kinds of vLLM instance, each its own set of OS processes (frontend +
EngineCore + Worker), all on 127.0.0.1:

  agg      one ordinary instance, no KV connector: the reference outputs
  prefill  kv_role kv_producer: runs each prompt with max_tokens=1 and
           kv_transfer_params {"do_remote_decode": true}; its output carries
           the kv_transfer_params the decode side needs (engine id, block
           ids, side-channel host/port, ...)
  decode   kv_role kv_consumer: gets the same prompt with max_tokens=N and
           those params ("do_remote_prefill": true); its connector pulls the
           prompt's KV blocks from the prefill instance instead of computing
           them, then decodes greedily

This script is the orchestrator (the "proxy").  It starts the instances one
at a time (each start costs ~25 s of CPU), drives them over a JSON-line
control socket on 127.0.0.1, and runs

  1. a warm-up request (includes the connector handshake; reported as "cold")
  2. --num-prompts requests one at a time: P, then D (clean per-request times)
  3. --batch more prompts sent together: all to P, then all to D

and checks, for every request:

  * token equality: decode output == aggregated output, token for token
    (and the prefill instance's single token == the reference's first token)
  * the KV really moved: on the decode side the prompt tokens are counted as
    external KV-transfer tokens and none as computed (vLLM's
    PromptTokenStats, from a stat logger in the instance), and the
    connector's transfer telemetry reports bytes moved == remote blocks x
    bytes per block
  * no KV lease expiry / transfer / handshake failure in the instance logs
    (a decode that reads blocks the prefill side already released can still
    produce the right tokens, by luck, if nothing reused them)

Offline mode carries kv_transfer_params: they go in
SamplingParams(extra_args={"kv_transfer_params": ...}) (vllm/v1/request.py)
and come back on RequestOutput.kv_transfer_params.  The instances are built
with LLMEngine.from_engine_args (what vllm.LLM does) so that a stat logger can
capture the per-step connector stats; requests go through add_request/step so
the first token is timed when it arrives.

--connector NAME       a connector registered in vLLM (NixlConnector, ...)
--connector MOD:CLASS  an out-of-tree one, loaded through
                       kv_connector_module_path=MOD, kv_connector=CLASS
                       (this folder is on the instances' PYTHONPATH, so
                       nixl_noprog:NixlNoProgConnector and
                       trace_connector:TracingConnector work as is)
--layout split         (default) after start, pin every thread of the prefill
                       instance to --p-cpus (0), decode to --d-cpus (1), the
                       reference to --agg-cpus (1): one core per instance, like
                       separate hosts.  --layout none keeps vLLM's placement.

Results go to --out (default: results/<UTC time>-<connector> beside this
script): results.json, summary.md, one log per instance.  Exit status 0 only
if every check passed.

Other modes:  --summarize DIR...    median table over several result folders
              --trace-report DIR    call table from a trace_connector trace
"""
import argparse
import datetime as _dt
import hashlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


# ------------------------------------------------------------------ control channel
class Channel:
    """Newline-delimited JSON over a TCP socket, with timeouts."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def send(self, obj):
        self.sock.sendall((json.dumps(obj) + "\n").encode())

    def recv(self, timeout, alive=None):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply within {timeout:.0f} s")
            self.sock.settimeout(min(left, 1.0))
            try:
                chunk = self.sock.recv(1 << 20)
            except socket.timeout:
                if alive is not None and not alive():
                    raise RuntimeError("peer process exited")
                continue
            if not chunk:
                raise RuntimeError("control connection closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)


def group_threads(pgid):
    """Every thread of every process in process group `pgid`: name, allowed
    CPUs, CPU seconds used so far."""
    out = []
    tck = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                st = f.read()
            if int(st[st.rfind(")") + 2:].split()[2]) != pgid:
                continue
            tids = os.listdir(f"/proc/{pid}/task")
        except (OSError, ValueError, IndexError):
            continue
        for tid in tids:
            base = f"/proc/{pid}/task/{tid}"
            try:
                with open(base + "/comm") as f:
                    comm = f.read().strip()
                with open(base + "/stat") as f:
                    tf = f.read()
                tf = tf[tf.rfind(")") + 2:].split()
                with open(base + "/status") as f:
                    cpus = next(ln.split(":", 1)[1].strip() for ln in f
                                if ln.startswith("Cpus_allowed_list"))
            except (OSError, StopIteration, IndexError):
                continue
            out.append({"pid": int(pid), "tid": int(tid), "comm": comm, "cpus": cpus,
                        "cpu_s": (int(tf[11]) + int(tf[12])) / tck})
    return out


def parse_cpus(spec):
    out = set()
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.update(range(int(a), int(b) + 1))
        elif part.strip():
            out.add(int(part))
    return out


def pin_group(pgid, cpus):
    """Set the CPU affinity of every thread of process group `pgid` (threads
    created later inherit it from their creator)."""
    n = 0
    for t in group_threads(pgid):
        try:
            os.sched_setaffinity(t["tid"], cpus)
            n += 1
        except OSError:
            pass
    return n


def cpu_delta(before, after, wall, top=10):
    """Threads that used the most CPU between two group_threads() snapshots."""
    b = {(t["pid"], t["tid"]): t["cpu_s"] for t in before}
    rows = []
    for t in after:
        d = t["cpu_s"] - b.get((t["pid"], t["tid"]), 0.0)
        rows.append({**t, "cpu_s": round(d, 2), "pct_of_core": round(100 * d / wall, 1) if wall else None})
    rows.sort(key=lambda r: -r["cpu_s"])
    return {"wall_s": round(wall, 2), "total_pct_of_core": round(sum(r["cpu_s"] for r in rows) * 100 / wall, 1)
            if wall else None, "top": rows[:top]}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ instance (server side)
def parse_connector(spec):
    if ":" in spec:
        mod, cls = spec.split(":", 1)
        return {"kv_connector": cls, "kv_connector_module_path": mod}
    return {"kv_connector": spec}


def serve(args):
    """Run one vLLM instance and answer the orchestrator's commands."""
    sock = socket.create_connection(("127.0.0.1", args.ctl_port), timeout=30)
    ch = Channel(sock)
    t0 = time.perf_counter()

    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.metrics.loggers import StatLoggerBase

    sink = {"kv": [], "computed": 0, "local_cache_hit": 0, "external_kv_transfer": 0,
            "cached_tokens": 0, "total": 0, "steps": 0}

    class Capture(StatLoggerBase):
        """Keeps the raw per-step connector stats and prompt-token sources."""

        def __init__(self, vllm_config, engine_index=0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            sink["steps"] += 1
            if scheduler_stats is not None and scheduler_stats.kv_connector_stats:
                kv = scheduler_stats.kv_connector_stats
                sink["kv"].append(kv if isinstance(kv, dict) else getattr(kv, "data", str(kv)))
            if iteration_stats is not None:
                pts = iteration_stats.prompt_token_stats
                for k in ("computed", "local_cache_hit", "external_kv_transfer",
                          "cached_tokens", "total"):
                    sink[k] += getattr(pts, k, 0)

        def log_engine_initialized(self):
            pass

    kv_cfg = None
    if args.serve in ("prefill", "decode"):
        kv_cfg = parse_connector(args.connector)
        kv_cfg["kv_role"] = args.p_role if args.serve == "prefill" else args.d_role
        kv_cfg["kv_buffer_device"] = "cpu"
        if args.kv_extra:
            kv_cfg["kv_connector_extra_config"] = json.loads(args.kv_extra)
        if args.kv_load_failure_policy:
            kv_cfg["kv_load_failure_policy"] = args.kv_load_failure_policy
        from vllm.config.kv_transfer import KVTransferConfig
        kv_cfg = KVTransferConfig(**kv_cfg)

    ea = EngineArgs(
        model=args.model, skip_tokenizer_init=True, dtype=args.dtype,
        max_model_len=args.max_model_len, enforce_eager=True, max_num_seqs=args.max_num_seqs,
        kv_cache_memory_bytes=args.kv_cache_bytes, disable_log_stats=False, seed=0,
        block_size=args.block_size, kv_transfer_config=kv_cfg,
        enable_prefix_caching=not args.no_prefix_caching,
    )
    engine = LLMEngine.from_engine_args(ea, usage_context=UsageContext.LLM_CLASS,
                                        stat_loggers=[Capture])
    vc = engine.vllm_config
    init_s = time.perf_counter() - t0
    ch.send({"ready": True, "role": args.serve, "pid": os.getpid(), "init_s": round(init_s, 2),
             "block_size": vc.cache_config.block_size,
             "num_blocks": vc.cache_config.num_gpu_blocks,
             "engine_id": vc.kv_transfer_config.engine_id if vc.kv_transfer_config else None})

    def die(msg):
        print(f"instance {args.serve}: {msg}; shutting down", file=sys.stderr, flush=True)
        try:
            engine.engine_core.shutdown()
        finally:
            os._exit(1)

    n = 0
    while True:
        try:
            cmd = ch.recv(timeout=24 * 3600)
        except Exception as e:  # noqa: BLE001  (orchestrator gone)
            die(repr(e))
        op = cmd.get("op")
        if op == "generate":
            n += 1
            for k in list(sink):
                sink[k] = [] if k == "kv" else 0
            extra = {"kv_transfer_params": cmd["kv"]} if cmd.get("kv") is not None else None
            sp = SamplingParams(max_tokens=cmd["max_tokens"], temperature=0.0, ignore_eos=True,
                                detokenize=False, extra_args=extra)
            rid = f"{args.serve}-{n}"
            ts = time.perf_counter()
            engine.add_request(rid, {"prompt_token_ids": cmd["prompt"]}, sp)
            t_first, final = None, None
            while engine.has_unfinished_requests():
                outs = engine.step()
                now = time.perf_counter()
                for o in outs:
                    if t_first is None and o.outputs and len(o.outputs[0].token_ids) > 0:
                        t_first = now
                    if o.finished:
                        final = o
            te = time.perf_counter()
            # a few more empty steps are not needed; stats of the last step
            # arrive with the last output
            ch.send({
                "tokens": list(final.outputs[0].token_ids) if final else None,
                "kv_transfer_params": final.kv_transfer_params if final else None,
                "num_cached_tokens": final.num_cached_tokens if final else None,
                "finish_reason": final.outputs[0].finish_reason if final and final.outputs else None,
                "request_id": rid,
                "wall_s": te - ts, "ttft_s": (t_first - ts) if t_first else None,
                "prompt_tokens": {k: sink[k] for k in ("computed", "local_cache_hit",
                                                       "external_kv_transfer", "cached_tokens",
                                                       "total")},
                "kv_stats": sink["kv"],
            })
        elif op == "batch":
            # several requests at once: all added, then stepped together
            for k in list(sink):
                sink[k] = [] if k == "kv" else 0
            ts = time.perf_counter()
            rids, alias = [], {}
            for j, prompt in enumerate(cmd["prompts"]):
                n += 1
                kvp = cmd["kv"][j] if cmd.get("kv") else None
                sp = SamplingParams(max_tokens=cmd["max_tokens"], temperature=0.0, ignore_eos=True,
                                    detokenize=False,
                                    extra_args={"kv_transfer_params": kvp} if kvp is not None else None)
                ext = f"{args.serve}-{n}"
                full = engine.add_request(ext, {"prompt_token_ids": prompt}, sp)
                rids.append(ext)
                alias[ext] = ext
                if full:
                    alias[full] = ext
            first, fin = {}, {}
            while engine.has_unfinished_requests():
                outs = engine.step()
                now = time.perf_counter()
                for o in outs:
                    base = alias.get(o.request_id, o.request_id)
                    if base not in first and o.outputs and len(o.outputs[0].token_ids) > 0:
                        first[base] = now - ts
                    if o.finished:
                        fin[base] = (o, now - ts)
            te = time.perf_counter()
            ch.send({
                "wall_s": te - ts,
                "results": [{"tokens": list(fin[r][0].outputs[0].token_ids) if r in fin else None,
                             "kv_transfer_params": fin[r][0].kv_transfer_params if r in fin else None,
                             "ttft_s": first.get(r), "done_s": fin[r][1] if r in fin else None}
                            for r in rids],
                "prompt_tokens": {k: sink[k] for k in ("computed", "local_cache_hit",
                                                       "external_kv_transfer", "cached_tokens",
                                                       "total")},
                "kv_stats": sink["kv"],
            })
        elif op == "shutdown":
            ch.send({"bye": True})
            try:
                engine.engine_core.shutdown()
            except Exception as e:  # noqa: BLE001
                print(f"shutdown: {e!r}", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        else:
            ch.send({"error": f"unknown op {op!r}"})


# ------------------------------------------------------------------ orchestrator
class Instance:
    def __init__(self, role, proc, log_path):
        self.role, self.proc, self.log_path = role, proc, log_path
        self.ch = None
        self.info = None

    def alive(self):
        return self.proc.poll() is None

    def call(self, obj, timeout):
        self.ch.send(obj)
        return self.ch.recv(timeout, alive=self.alive)

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        # the group may still hold EngineCore/Worker children
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def tail(self, n=40):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


def start_instance(args, role, server, out_dir, env_extra, cpus=None):
    env = dict(os.environ)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)   # kv_cache_memory_bytes sizes the cache
    env.update({
        "VLLM_HOST_IP": "127.0.0.1",          # keep vLLM's own sockets on loopback
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "UCX_NET_DEVICES": args.ucx_net_devices,
        "PYTHONPATH": HERE + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        "PYTHONUNBUFFERED": "1",
    })
    if args.ucx_tls:
        env["UCX_TLS"] = args.ucx_tls
    if args.reserved_cpus != "":
        # vLLM reserves local_world_size cores for the scheduler process, plus
        # as many again when a KV connector is set: 2 of 2 cores here, and it
        # then falls back to 2 OpenMP threads on both cores (spin-waiting)
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = args.reserved_cpus
    if args.trace:
        env["PD_TRACE_DIR"] = os.path.join(out_dir, "trace")
    env.update(env_extra)
    cmd = [sys.executable, os.path.abspath(__file__), "--serve", role,
           "--ctl-port", str(server.getsockname()[1])] + args.passthrough
    log_path = os.path.join(out_dir, f"{role}.log")
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, cwd=HERE)
    inst = Instance(role, proc, log_path)
    deadline = time.monotonic() + args.start_timeout
    server.settimeout(1.0)
    while True:
        try:
            conn, _ = server.accept()
            break
        except socket.timeout:
            if not inst.alive():
                raise RuntimeError(f"{role} exited during start (rc={proc.returncode})\n{inst.tail()}")
            if time.monotonic() > deadline:
                inst.kill()
                raise TimeoutError(f"{role} did not connect within {args.start_timeout} s")
    inst.ch = Channel(conn)
    left = max(1.0, deadline - time.monotonic())
    inst.info = inst.ch.recv(left, alive=inst.alive)
    if cpus:
        # one core per instance, like separate hosts; this also undoes
        # NixlConnector's own sched_setaffinity of the worker's main thread
        # to the last core (base_worker.py, CPU platform)
        inst.info["pinned_threads"] = pin_group(proc.pid, parse_cpus(cpus))
        inst.info["cpus"] = cpus
    return inst


LOG_PATTERNS = {
    "kv_lease_expired": "Releasing expired KV blocks",
    "read_after_expiry": "Potentially invalid KV blocks",
    "transfer_failure": "transfer failure",
    "handshake_failed": "handshake_failed",
    "kv_load_failure": "due to KV load failure",
    # hixl.vllm's own lines for the same events
    "hixl_lease_expired": "KV lease expired",
    "hixl_load_failure": "KV load failure for request",
    "hixl_lease_failed": "could not lease the blocks",
}


def scan_logs(out_dir):
    counts = {k: 0 for k in LOG_PATTERNS}
    for role in ("agg", "prefill", "decode"):
        path = os.path.join(out_dir, f"{role}.log")
        if not os.path.exists(path):
            continue
        with open(path, errors="replace") as f:
            for line in f:
                for k, pat in LOG_PATTERNS.items():
                    if pat in line:
                        counts[k] += 1
    return counts


class RefCache:
    """The aggregated instance's outputs, kept per prompt in --reference-cache DIR (one JSON
    file per prompt, or per batch, keyed by a hash of the prompt, max_tokens and every engine
    setting that can change a token): greedy decoding of the same model under the same settings
    gives the same tokens, so a later run (another transport, a fault run) compares against them
    without starting the reference again. Its timings are the cached run's."""

    FIELDS = ("model", "dtype", "block_size", "max_model_len", "max_num_seqs", "kv_cache_bytes",
              "no_prefix_caching", "max_tokens")

    def __init__(self, args):
        self.dir = args.reference_cache
        self.settings = {k: getattr(args, k) for k in self.FIELDS}
        # The model's files as they are (a model folder made anew has other weights).
        try:
            self.settings["model_files"] = sorted(
                (e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(args.model))
        except OSError:
            self.dir = None

    def _path(self, what, prompt):
        key = json.dumps([what, prompt, self.settings], sort_keys=True).encode()
        return os.path.join(self.dir, hashlib.sha256(key).hexdigest()[:32] + ".json")

    def _entries(self, allp, bprompts):
        out = [((kind, i), self._path("generate", p)) for kind, i, p in allp]
        if bprompts:
            out.append(("batch", self._path("batch", bprompts)))
        return out

    def fill(self, ref, allp, bprompts):
        """Fills ``ref`` from the cache if it holds every output; True then."""
        if not self.dir:
            return False
        got = {}
        for k, path in self._entries(allp, bprompts):
            try:
                with open(path) as f:
                    got[k] = json.load(f)
            except (OSError, ValueError):
                return False
        ref.update(got)
        return True

    def store(self, ref, allp, bprompts):
        if not self.dir:
            return
        os.makedirs(self.dir, exist_ok=True)
        for k, path in self._entries(allp, bprompts):
            if k in ref:
                with open(path + ".tmp", "w") as f:
                    json.dump(ref[k], f)
                os.replace(path + ".tmp", path)


def make_prompts(seed, n, lo, hi, vocab):
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def kv_bytes_of(stats_list):
    """Sum NIXL-style telemetry over the steps of one request."""
    tot = {"bytes": 0, "xfers": 0, "xfer_s": 0.0, "post_s": 0.0, "descs": 0, "failed": 0}
    seen = False
    for d in stats_list:
        if not isinstance(d, dict):
            continue
        # MultiConnector nests {name: data}
        datas = [d] if "bytes_transferred" in d else [v for v in d.values() if isinstance(v, dict)]
        for x in datas:
            if "bytes_transferred" not in x:
                continue
            seen = True
            tot["bytes"] += int(sum(x.get("bytes_transferred", [])))
            tot["xfers"] += len(x.get("transfer_duration", []))
            tot["xfer_s"] += float(sum(x.get("transfer_duration", [])))
            tot["post_s"] += float(sum(x.get("post_duration", [])))
            tot["descs"] += int(sum(x.get("num_descriptors", [])))
            tot["failed"] += sum(len(x.get(k, [])) for k in
                                 ("num_failed_transfers", "num_failed_notifications",
                                  "num_failed_handshakes", "num_kv_expired_reqs"))
    return tot if seen else None


def layer_blocks(groups):
    """The blocks a request's KV takes, in blocks of every layer: per KV cache group its
    blocks but vLLM's null block 0 (a sliding window's dropped positions), each holding that
    group's share of the layers (vLLM's hybrid allocator gives its groups equal layer counts)."""
    groups = [g for g in (groups or []) if isinstance(g, (list, tuple))] or [groups or []]
    return sum(1 for g in groups for b in g if b != 0) / len(groups)


def run_batch(args, pre, dec, prompts, ref, bytes_per_block, log):
    """All prompts to P at once, then all their params to D at once."""
    p0 = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
          "remote_block_ids": None, "remote_host": None, "remote_port": None}
    t_a = time.perf_counter()
    pr = pre.call({"op": "batch", "prompts": prompts, "max_tokens": 1,
                   "kv": [dict(p0) for _ in prompts]}, args.req_timeout)
    t_b = time.perf_counter()
    params = [r["kv_transfer_params"] for r in pr["results"]]
    if not all(params):
        raise RuntimeError("batch: prefill returned no kv_transfer_params for some request: " +
                           json.dumps(pr)[:1500])
    d_params = []
    for prm in params:
        q = dict(prm)
        if not args.keep_cached_key:
            q.pop("remote_prefill_cached_tokens", None)
        d_params.append(q)
    dr = dec.call({"op": "batch", "prompts": prompts, "max_tokens": args.max_tokens,
                   "kv": d_params}, args.req_timeout)
    t_c = time.perf_counter()
    kvb = kv_bytes_of(dr.get("kv_stats") or [])
    nblk = sum(layer_blocks(prm.get("remote_block_ids")) for prm in params)
    eq = [ref is not None and d["tokens"] == r["tokens"] for d, r in
          zip(dr["results"], (ref or {}).get("results", [{}] * len(prompts)))]
    pt = dr["prompt_tokens"]
    out = {
        "n": len(prompts), "prompt_lens": [len(p) for p in prompts],
        "p_wall_s": pr["wall_s"], "d_wall_s": dr["wall_s"], "e2e_s": t_c - t_a, "handoff_s": t_b - t_a - pr["wall_s"],
        "d_ttft_s": [r["ttft_s"] for r in dr["results"]],
        "ref_wall_s": ref["wall_s"] if ref else None,
        "ref_ttft_s": [r["ttft_s"] for r in ref["results"]] if ref else None,
        "kv": kvb, "remote_blocks": nblk, "expected_kv_bytes": nblk * bytes_per_block,
        "d_prompt_tokens": pt, "tokens_equal": eq,
        "checks": {
            "batch_tokens_equal": ref is not None and all(eq),
            "batch_prompt_not_computed": pt["computed"] == 0 and pt["external_kv_transfer"] == sum(len(p) for p in prompts),
            "batch_kv_bytes_eq_expected": bool(kvb and kvb["bytes"] == nblk * bytes_per_block),
        },
    }
    if ref is None:
        out["checks"].pop("batch_tokens_equal")
    log(f"batch of {len(prompts)}: P {pr['wall_s'] * 1e3:.1f} ms | D {dr['wall_s'] * 1e3:.1f} ms "
        f"(median TTFT {fmt(med(out['d_ttft_s']), 1e3)} ms) | agg {fmt(out['ref_wall_s'], 1e3)} ms | "
        f"KV {(kvb or {}).get('bytes')} B in {(kvb or {}).get('xfers')} xfer(s) | "
        f"{'OK' if all(out['checks'].values()) else 'FAIL ' + str(out['checks'])}")
    return out


def model_geometry(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    heads = c["num_attention_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    dt = {"bfloat16": 2, "float16": 2, "float32": 4}.get(c.get("dtype") or c.get("torch_dtype"), 2)
    return {"vocab": c["vocab_size"], "layers": c["num_hidden_layers"],
            "kv_heads": c.get("num_key_value_heads", heads), "head_dim": head_dim, "dtype_bytes": dt}


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, scale=1.0, nd=1):
    return "-" if x is None else f"{x * scale:.{nd}f}"


def run_fault(args, pre, dec, prompt, ref_tokens, log):
    """One request under a fault (see --fault); returns its record with "checks"."""
    p0 = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
          "remote_block_ids": None, "remote_host": None, "remote_port": None}
    out = {"fault": args.fault, "policy": args.kv_load_failure_policy or "fail",
           "prompt_len": len(prompt)}
    pr = pre.call({"op": "generate", "prompt": prompt, "max_tokens": 1, "kv": p0},
                  args.req_timeout)
    params = pr.get("kv_transfer_params")
    if not params:
        raise RuntimeError(f"fault {args.fault}: the prefill returned no kv_transfer_params: {pr}")
    d_params = {k: v for k, v in params.items() if k != "remote_prefill_cached_tokens"}
    checks = {}
    if args.fault == "no-pull":
        lease_s = json.loads(args.kv_extra or "{}").get("lease_ms", 30000) / 1e3
        rid = params.get("remote_request_id")
        pats = {"lease_expired_logged": f"KV lease expired for request {rid}",
                "vllm_freed_the_blocks": f"Finished sending KV transfer for request {rid}"}
        t0 = time.monotonic()
        seen = {}
        while time.monotonic() < t0 + lease_s + args.fault_bound_s and len(seen) < len(pats):
            with open(pre.log_path, errors="replace") as f:
                txt = f.read()
            for k, pat in pats.items():
                if k not in seen and pat in txt:
                    seen[k] = round(time.monotonic() - t0, 2)
            time.sleep(0.1)
        out.update(lease_s=lease_s, seen_after_s=seen)
        checks = {k: k in seen for k in pats}
        checks["not_before_the_lease"] = all(v >= lease_s * 0.9 for v in seen.values())
        pr2 = pre.call({"op": "generate", "prompt": prompt, "max_tokens": 1, "kv": p0},
                       args.req_timeout)
        checks["prefill_serves_after"] = bool(pr2.get("kv_transfer_params"))
        log(f"fault no-pull: lease {lease_s} s, seen after {seen}")
    else:
        def kill():
            try:
                os.killpg(pre.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if args.fault_delay_ms is None:
            kill()
            pre.proc.wait(timeout=30)
        else:
            import threading
            threading.Timer(args.fault_delay_ms / 1e3, kill).start()
        t0 = time.perf_counter()
        dr = dec.call({"op": "generate", "prompt": prompt, "max_tokens": args.max_tokens,
                       "kv": d_params}, args.fault_bound_s + args.req_timeout)
        d_s = time.perf_counter() - t0
        toks = dr.get("tokens") or []
        pt = dr["prompt_tokens"]
        arrived = pt["computed"] == 0 and pt["external_kv_transfer"] == len(prompt)
        out.update(d_s=round(d_s, 3), d_tokens=len(toks), finish_reason=dr.get("finish_reason"),
                   d_prompt_tokens=pt, kv_arrived_before_the_kill=arrived)
        checks["ended_within_bound"] = d_s <= args.fault_bound_s
        checks["no_wrong_token"] = ref_tokens is not None and toks == ref_tokens[:len(toks)]
        if arrived:
            checks["tokens_equal"] = toks == ref_tokens
        elif out["policy"] == "recompute":
            checks["recomputed_tokens_equal"] = toks == ref_tokens
            checks["prompt_recomputed"] = pt["computed"] > 0
        else:
            checks["request_failed"] = len(toks) < args.max_tokens and \
                dr.get("finish_reason") not in ("length", "stop")
        dr2 = dec.call({"op": "generate", "prompt": prompt, "max_tokens": args.max_tokens},
                       args.req_timeout)
        checks["decode_serves_after"] = dr2.get("tokens") == ref_tokens
        log(f"fault kill-prefill ({out['policy']}): decode ended in {d_s * 1e3:.1f} ms with "
            f"{len(toks)} tokens, finish {dr.get('finish_reason')}, prompt tokens {pt}")
    out["checks"] = checks
    return out


def _sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def orchestrate(args):
    signal.signal(signal.SIGTERM, _sigterm)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    tag = args.connector.replace(":", "_").replace("/", "_")
    out_dir = args.out or os.path.join(HERE, "results", f"{stamp}-{tag}")
    os.makedirs(out_dir, exist_ok=True)
    geo = model_geometry(args.model)
    dtype_bytes = {"bfloat16": 2, "float16": 2, "float32": 4}.get(args.dtype, geo["dtype_bytes"])

    prompts = make_prompts(args.seed, args.num_prompts, args.min_len, args.max_len, geo["vocab"])
    warm = make_prompts(args.seed + 7919, args.warmup, args.min_len, args.max_len, geo["vocab"])
    allp = [("warmup", i, p) for i, p in enumerate(warm)] + [("req", i, p) for i, p in enumerate(prompts)]
    bprompts = make_prompts(args.seed + 104729, args.batch, args.min_len, args.max_len, geo["vocab"]) \
        if args.batch else []

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    p_port, d_port = free_port(), free_port()
    while d_port == p_port:
        d_port = free_port()

    res = {"connector": args.connector, "started_utc": stamp, "args": vars(args),
           "env": {k: os.environ.get(k) for k in ("UCX_TLS", "UCX_NET_DEVICES")},
           "ucx_tls": args.ucx_tls, "p_side_channel_port": p_port, "d_side_channel_port": d_port,
           "requests": [], "timings": {}}
    insts = []
    ok = True
    t_run = time.perf_counter()
    lay = ({"agg": args.agg_cpus, "prefill": args.p_cpus, "decode": args.d_cpus}
           if args.layout == "split" else {"agg": None, "prefill": None, "decode": None})
    res["layout"] = {"mode": args.layout, **lay}

    def log(msg):
        print(f"[pd_e2e {time.perf_counter() - t_run:7.1f}s] {msg}", flush=True)

    try:
        # 1) reference: aggregated single instance
        ref = {}
        cache = RefCache(args)
        if not args.skip_baseline and cache.fill(ref, allp, bprompts):
            log(f"reference outputs from {args.reference_cache} (same model, prompts and engine "
                "settings as a run before): no aggregated instance started")
            res["timings"]["agg_cached"] = True
        elif not args.skip_baseline:
            log("starting aggregated reference instance")
            agg = start_instance(args, "agg", server, out_dir, {}, cpus=lay["agg"])
            insts.append(agg)
            log(f"agg ready in {agg.info['init_s']} s (block_size {agg.info['block_size']})")
            res["timings"]["agg_init_s"] = agg.info["init_s"]
            for kind, i, p in allp:
                r = agg.call({"op": "generate", "prompt": p, "max_tokens": args.max_tokens},
                             args.req_timeout)
                ref[(kind, i)] = r
            if bprompts:
                ref["batch"] = agg.call({"op": "batch", "prompts": bprompts,
                                         "max_tokens": args.max_tokens}, args.req_timeout)
            agg.call({"op": "shutdown"}, 60)
            agg.proc.wait(timeout=60)
            agg.kill()
            insts.remove(agg)
            cache.store(ref, allp, bprompts)
            log("agg done")

        # 2) prefill and decode instances, started one after the other
        log(f"starting prefill instance ({args.connector}, {args.p_role}, side channel {p_port})")
        p_env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(p_port)}
        if args.fault == "no-pull":
            p_env["VLLM_LOGGING_LEVEL"] = "DEBUG"   # vLLM logs the blocks it frees
        pre = start_instance(args, "prefill", server, out_dir, p_env, cpus=lay["prefill"])
        insts.append(pre)
        log(f"prefill ready in {pre.info['init_s']} s, engine {pre.info['engine_id']}")
        log(f"starting decode instance ({args.d_role}, side channel {d_port})")
        dec = start_instance(args, "decode", server, out_dir,
                             {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(d_port)}, cpus=lay["decode"])
        insts.append(dec)
        log(f"decode ready in {dec.info['init_s']} s, engine {dec.info['engine_id']}")
        res["timings"].update(prefill_init_s=pre.info["init_s"], decode_init_s=dec.info["init_s"])
        res["instances"] = {"prefill": pre.info, "decode": dec.info}
        block_size = dec.info["block_size"]
        bytes_per_block = geo["layers"] * 2 * geo["kv_heads"] * geo["head_dim"] * dtype_bytes * block_size

        res["threads_at_ready"] = {inst.role: group_threads(inst.proc.pid) for inst in (pre, dec)}
        # 3) requests, one at a time: P (max_tokens=1) -> params -> D (max_tokens=N)
        snap0 = None
        for kind, i, p in allp:
            if args.fault and kind == "req":
                rr = ref.get((kind, i))
                res["fault"] = run_fault(args, pre, dec, p, rr["tokens"] if rr else None, log)
                if args.fault == "kill-prefill":
                    insts.remove(pre)
                break
            if kind == "req" and snap0 is None:
                snap0 = ({inst.role: group_threads(inst.proc.pid) for inst in (pre, dec)},
                         time.perf_counter())
            t_a = time.perf_counter()
            pr = pre.call({"op": "generate", "prompt": p, "max_tokens": 1,
                           "kv": {"do_remote_decode": True, "do_remote_prefill": False,
                                  "remote_engine_id": None, "remote_block_ids": None,
                                  "remote_host": None, "remote_port": None}},
                          args.req_timeout)
            t_b = time.perf_counter()
            params = pr.get("kv_transfer_params")
            if not params:
                raise RuntimeError(f"prefill returned no kv_transfer_params for {kind} {i}: {pr}")
            d_params = dict(params)
            if not args.keep_cached_key:
                # reporting-only key: with it, D's num_cached_tokens would
                # show P's prefix-cache hits instead of D's own count
                d_params.pop("remote_prefill_cached_tokens", None)
            t_c = time.perf_counter()
            dr = dec.call({"op": "generate", "prompt": p, "max_tokens": args.max_tokens,
                           "kv": d_params}, args.req_timeout)
            t_d = time.perf_counter()
            kvb = kv_bytes_of(dr.get("kv_stats") or [])
            nblk = layer_blocks(params.get("remote_block_ids"))
            rr = ref.get((kind, i))
            rec = {
                "kind": kind, "idx": i, "prompt_len": len(p),
                "p_wall_s": pr["wall_s"], "p_token": (pr["tokens"] or [None])[0],
                "p_prompt_tokens": pr["prompt_tokens"],
                "d_ttft_s": dr["ttft_s"], "d_wall_s": dr["wall_s"],
                "d_tpot_s": ((dr["wall_s"] - dr["ttft_s"]) / (len(dr["tokens"]) - 1)
                             if dr["ttft_s"] is not None and dr["tokens"] and len(dr["tokens"]) > 1
                             else None),
                "handoff_s": t_c - t_b,
                "e2e_ttft_s": (t_c - t_a) + (dr["ttft_s"] or 0.0),
                "e2e_total_s": t_d - t_a,
                "d_tokens": dr["tokens"], "d_num_cached_tokens": dr["num_cached_tokens"],
                "d_prompt_tokens": dr["prompt_tokens"],
                "kv": kvb, "remote_blocks": nblk,
                "expected_kv_bytes": nblk * bytes_per_block,
                "p_params": params,
                "ref_tokens": rr["tokens"] if rr else None,
                "ref_ttft_s": rr["ttft_s"] if rr else None,
                "ref_wall_s": rr["wall_s"] if rr else None,
            }
            pt = dr["prompt_tokens"]
            rec["checks"] = {
                "tokens_equal": (rr is not None and dr["tokens"] == rr["tokens"]),
                "p_first_token_equal": (rr is not None and rr["tokens"]
                                        and rec["p_token"] == rr["tokens"][0]),
                "d_len": len(dr["tokens"] or []) == args.max_tokens,
                "d_prompt_not_computed": pt["computed"] == 0 and pt["external_kv_transfer"] > 0,
                "d_external_tokens_eq_prompt": pt["external_kv_transfer"] == len(p),
                "kv_bytes_seen": bool(kvb and kvb["bytes"] > 0),
                "kv_bytes_eq_expected": bool(kvb and kvb["bytes"] == rec["expected_kv_bytes"]),
            }
            if args.skip_baseline:
                rec["checks"].pop("tokens_equal")
                rec["checks"].pop("p_first_token_equal")
            res["requests"].append(rec)
            c = rec["checks"]
            bad = [k for k, v in c.items() if not v]
            log(f"{kind} {i}: len {len(p)} P {pr['wall_s'] * 1e3:.1f} ms | D ttft "
                f"{(dr['ttft_s'] or 0) * 1e3:.1f} ms total {dr['wall_s'] * 1e3:.1f} ms | "
                f"ext {pt['external_kv_transfer']} computed {pt['computed']} | KV "
                f"{(kvb or {}).get('bytes')} B in {(kvb or {}).get('xfers')} xfer(s) "
                f"(expected {rec['expected_kv_bytes']}) | {'OK' if not bad else 'FAIL ' + ','.join(bad)}")

        if bprompts and not args.fault:
            res["batch"] = run_batch(args, pre, dec, bprompts, ref.get("batch"), bytes_per_block, log)
        if snap0 is not None:
            wall = time.perf_counter() - snap0[1]
            res["cpu_measured_phase"] = {inst.role: cpu_delta(snap0[0][inst.role],
                                                              group_threads(inst.proc.pid), wall)
                                         for inst in (pre, dec)}
            for role, d in res["cpu_measured_phase"].items():
                log(f"CPU during measured requests, {role}: {d['total_pct_of_core']}% of a core; top: " +
                    ", ".join(f"{t['comm']}[{t['cpus']}] {t['pct_of_core']}%" for t in d["top"][:4]))
        for inst in (dec, pre):
            if inst not in insts:
                continue
            try:
                inst.call({"op": "shutdown"}, 60)
                inst.proc.wait(timeout=60)
            except Exception as e:  # noqa: BLE001
                log(f"{inst.role} shutdown: {e!r}")
    except BaseException as e:  # noqa: BLE001  (incl. SIGTERM from run.sh's timeout)
        ok = False
        res["error"] = repr(e)
        log(f"ERROR: {e!r}")
        for inst in insts:
            log(f"--- tail of {inst.role}.log ---\n{inst.tail()}")
    finally:
        for inst in insts:
            inst.kill()
        server.close()

    # connector trouble that the token check cannot see (e.g. the decode side
    # read blocks after the prefill side's lease had expired: right tokens
    # only because nothing had reused the blocks yet)
    res["log_events"] = scan_logs(out_dir)
    bad_events = {k: v for k, v in res["log_events"].items() if v}
    # A connector that reports no NIXL-style transfer telemetry
    # ("bytes_transferred" in its KVConnectorStats data) cannot be checked on
    # bytes; the other evidence stays: D computed none of the prompt, counted
    # it as external KV, and still produced the reference tokens.
    res["kv_stats_available"] = any(r["kv"] for r in res["requests"])
    if not res["kv_stats_available"] and not args.strict_kv_stats:
        for r in res["requests"]:
            r["checks"].pop("kv_bytes_seen", None)
            r["checks"].pop("kv_bytes_eq_expected", None)
        if res.get("batch"):
            res["batch"]["checks"].pop("batch_kv_bytes_eq_expected", None)
    meas = [r for r in res["requests"] if r["kind"] == "req"]
    all_checks = {"no_lease_expiry_or_xfer_failure_in_logs": [not bad_events]}
    if args.fault:
        # the fault's own log lines are expected; its checks replace the measured requests'
        all_checks = {k: [bool(v)] for k, v in (res.get("fault") or {}).get("checks", {}).items()}
        meas = [None] * args.num_prompts if res.get("fault") else []
    for k, v in (res.get("batch") or {}).get("checks", {}).items():
        all_checks[k] = [bool(v)]
    for r in res["requests"]:
        for k, v in r["checks"].items():
            all_checks.setdefault(k, []).append(bool(v))
    res["checks"] = {k: all(v) for k, v in all_checks.items()}
    res["all_ok"] = ok and bool(meas) and all(res["checks"].values()) and \
        len(meas) == args.num_prompts
    res["total_s"] = round(time.perf_counter() - t_run, 1)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = summary_md(res)
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(md)
    print(md)
    if args.trace:
        tdir = os.path.join(out_dir, "trace")
        if os.path.isdir(tdir):
            rep = trace_report(tdir)
            with open(os.path.join(out_dir, "trace_report.md"), "w") as f:
                f.write(rep)
            print(f"trace report: {os.path.join(out_dir, 'trace_report.md')}")
    if not args.no_scrub:
        scrub_paths(out_dir, args.model)
    print(f"results: {out_dir}  all_ok={res['all_ok']}")
    return 0 if res["all_ok"] else 1


def scrub_paths(out_dir, model=None):
    """Replace this machine's absolute paths in a result folder with $NAMES, so
    the folder can be committed and compared across machines."""
    reps = [(model, "$MODEL"), (sys.prefix, "$VENV"), (sys.base_prefix, "$PYTHON"),
            (HERE, "$BENCH"), (os.path.expanduser("~") + "/", "$HOME/"),
            (tempfile.gettempdir().rstrip("/") + "/", "$TMPDIR/")]
    reps = sorted({(a, b) for a, b in reps if a and len(a) > 2}, key=lambda ab: -len(ab[0]))
    n = 0
    for root, _, files in os.walk(out_dir):
        for fn in files:
            if not fn.endswith((".log", ".json", ".jsonl", ".md")):
                continue
            path = os.path.join(root, fn)
            with open(path, errors="replace") as f:
                text = f.read()
            new = text
            for a, b in reps:
                new = new.replace(a, b)
            if new != text:
                with open(path, "w") as f:
                    f.write(new)
                n += 1
    return n


def summary_md(res):
    meas = [r for r in res["requests"] if r["kind"] == "req"]
    warm = [r for r in res["requests"] if r["kind"] == "warmup"]
    L = [f"# P/D end to end: {res['connector']} ({res['started_utc']})", ""]
    lay = res.get("layout", {})
    L.append(f"UCX_TLS={res['ucx_tls'] or '(unset)'}, layout {lay.get('mode')} "
             f"(P cpus {lay.get('prefill')}, D cpus {lay.get('decode')}, agg cpus {lay.get('agg')}), init s: " + ", ".join(
        f"{k[:-7]} {v}" for k, v in res["timings"].items()))
    L.append("")
    L.append("| req | prompt | P prefill ms | D TTFT ms | D total ms | D TPOT ms | e2e TTFT ms | "
             "e2e total ms | agg TTFT ms | agg total ms | KV bytes | xfer ms | ext/computed | equal |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in warm + meas:
        kv = r["kv"] or {}
        pt = r["d_prompt_tokens"]
        name = ("warm" if r["kind"] == "warmup" else "") + str(r["idx"])
        L.append(f"| {name} | {r['prompt_len']} | {fmt(r['p_wall_s'], 1e3)} | {fmt(r['d_ttft_s'], 1e3)} | "
                 f"{fmt(r['d_wall_s'], 1e3)} | {fmt(r['d_tpot_s'], 1e3, 2)} | {fmt(r['e2e_ttft_s'], 1e3)} | "
                 f"{fmt(r['e2e_total_s'], 1e3)} | {fmt(r['ref_ttft_s'], 1e3)} | {fmt(r['ref_wall_s'], 1e3)} | "
                 f"{kv.get('bytes', '-')} | {fmt(kv.get('xfer_s'), 1e3, 2)} | "
                 f"{pt['external_kv_transfer']}/{pt['computed']} | "
                 f"{'yes' if r['checks'].get('tokens_equal', True) else 'NO'} |")
    if meas:
        L.append("")
        L.append(f"Medians over the {len(meas)} measured requests (warm-up excluded): "
                 f"P prefill {fmt(med([r['p_wall_s'] for r in meas]), 1e3)} ms, "
                 f"D TTFT {fmt(med([r['d_ttft_s'] for r in meas]), 1e3)} ms, "
                 f"D total {fmt(med([r['d_wall_s'] for r in meas]), 1e3)} ms, "
                 f"e2e TTFT {fmt(med([r['e2e_ttft_s'] for r in meas]), 1e3)} ms, "
                 f"e2e total {fmt(med([r['e2e_total_s'] for r in meas]), 1e3)} ms, "
                 f"agg TTFT {fmt(med([r['ref_ttft_s'] for r in meas]), 1e3)} ms, "
                 f"agg total {fmt(med([r['ref_wall_s'] for r in meas]), 1e3)} ms, "
                 f"NIXL xfer {fmt(med([(r['kv'] or {}).get('xfer_s') for r in meas]), 1e3, 2)} ms, "
                 f"KV {sum((r['kv'] or {}).get('bytes', 0) for r in meas)} B total.")
    b = res.get("batch")
    if b:
        kv = b["kv"] or {}
        L.append("")
        L.append(f"Batch of {b['n']} (sent together): P {fmt(b['p_wall_s'], 1e3)} ms, D {fmt(b['d_wall_s'], 1e3)} ms "
                 f"(TTFT median {fmt(med(b['d_ttft_s']), 1e3)} ms, max {fmt(max([x for x in b['d_ttft_s'] if x is not None], default=None), 1e3)} ms), "
                 f"e2e {fmt(b['e2e_s'], 1e3)} ms; agg {fmt(b['ref_wall_s'], 1e3)} ms; KV {kv.get('bytes')} B in "
                 f"{kv.get('xfers')} transfer(s), xfer time sum {fmt(kv.get('xfer_s'), 1e3, 2)} ms; "
                 f"tokens equal {sum(1 for x in b['tokens_equal'] if x)}/{b['n']}.")
    L.append("")
    L.append("Checks: " + ", ".join(f"{k}={'pass' if v else 'FAIL'}" for k, v in res["checks"].items()))
    if res.get("error"):
        L.append(f"\nERROR: {res['error']}")
    L.append(f"\nall_ok={res['all_ok']}, wall {res['total_s']} s")
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------ multi-run summary
def summarize(dirs):
    rows = []
    for d in dirs:
        with open(os.path.join(d, "results.json")) as f:
            res = json.load(f)
        meas = [r for r in res["requests"] if r["kind"] == "req"]
        warm = [r for r in res["requests"] if r["kind"] == "warmup"]
        rows.append({
            "run": os.path.basename(os.path.normpath(d)), "ok": res["all_ok"],
            "n": len(meas),
            "equal": sum(1 for r in meas if r["checks"].get("tokens_equal")),
            "p": med([r["p_wall_s"] for r in meas]), "dttft": med([r["d_ttft_s"] for r in meas]),
            "dtot": med([r["d_wall_s"] for r in meas]), "tpot": med([r["d_tpot_s"] for r in meas]),
            "ettft": med([r["e2e_ttft_s"] for r in meas]), "etot": med([r["e2e_total_s"] for r in meas]),
            "attft": med([r["ref_ttft_s"] for r in meas]), "atot": med([r["ref_wall_s"] for r in meas]),
            "xfer": med([(r["kv"] or {}).get("xfer_s") for r in meas]),
            "kvb": sum((r["kv"] or {}).get("bytes", 0) for r in meas),
            "cold_dttft": warm[0]["d_ttft_s"] if warm else None,
            "kvreq": med([(r["kv"] or {}).get("bytes") for r in meas]),
            "b_p": (res.get("batch") or {}).get("p_wall_s"), "b_d": (res.get("batch") or {}).get("d_wall_s"),
            "b_e2e": (res.get("batch") or {}).get("e2e_s"), "b_agg": (res.get("batch") or {}).get("ref_wall_s"),
            "b_n": (res.get("batch") or {}).get("n"),
            "inits": res["timings"], "connector": res["connector"],
        })
    keys = [("p", "P prefill ms", 1), ("dttft", "D TTFT ms", 1), ("dtot", "D total ms", 1),
            ("tpot", "D TPOT ms", 2), ("ettft", "e2e TTFT ms", 1), ("etot", "e2e total ms", 1),
            ("attft", "agg TTFT ms", 1), ("atot", "agg total ms", 1), ("xfer", "xfer ms", 2),
            ("cold_dttft", "cold D TTFT ms", 1), ("b_p", "batch P ms", 1), ("b_d", "batch D ms", 1),
            ("b_e2e", "batch e2e ms", 1), ("b_agg", "batch agg ms", 1)]
    L = ["| run | connector | ok | equal | " + " | ".join(k[1] for k in keys) + " | KV B/req |",
         "|" + "---|" * (len(keys) + 5)]
    for r in rows:
        L.append(f"| {r['run']} | {r['connector']} | {r['ok']} | {r['equal']}/{r['n']} | "
                 + " | ".join(fmt(r[k], 1e3, nd) for k, _, nd in keys)
                 + f" | {fmt(r['kvreq'], 1, 0)} |")
    if len(rows) > 1:
        L.append(f"| **median** | | {all(r['ok'] for r in rows)} | "
                 f"{sum(r['equal'] for r in rows)}/{sum(r['n'] for r in rows)} | "
                 + " | ".join(fmt(med([r[k] for r in rows]), 1e3, nd) for k, _, nd in keys)
                 + f" | {fmt(med([r['kvreq'] for r in rows]), 1, 0)} |")
    L.append("")
    L.append("Per-request columns are medians over the measured requests of a run (one request "
             "at a time); e2e = P prefill + hand-off + D; cold = the first (warm-up) request, "
             "which includes the connector handshake; batch = all batch prompts sent together "
             f"({rows[0]['b_n'] if rows else '-'} here), wall time of each phase.")
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------ trace report
def trace_report(tdir):
    recs = []
    for fn in sorted(os.listdir(tdir)):
        if fn.endswith(".jsonl"):
            with open(os.path.join(tdir, fn)) as f:
                for line in f:
                    try:
                        recs.append(json.loads(line))
                    except ValueError:
                        pass
    recs.sort(key=lambda r: r["t"])
    if not recs:
        return "no trace records\n"
    # which pid is which side (P or D): from __init__ records
    side = {}
    for r in recs:
        if r["m"] == "__init__":
            kv_role = r["args"][0].split("=", 1)[1]
            side[r["pid"]] = ("P" if kv_role == "kv_producer" else "D" if kv_role == "kv_consumer"
                              else kv_role) + "/" + r["role"]
    for r in recs:
        if r["pid"] not in side:
            side[r["pid"]] = f"pid{r['pid']}/{r['role']}"
    first, count = {}, {}
    for r in recs:
        key = (side[r["pid"]], r["m"])
        count[key] = count.get(key, 0) + 1
        first.setdefault(key, r["t"])
    t0 = recs[0]["t"]

    def short(x, n=200):
        s = json.dumps(x, default=str)
        return (s if len(s) <= n else s[:n - 3] + "...").replace("|", "\\|")

    L = ["# Connector calls seen (trace_connector)", "",
         "Sides: P = prefill instance (kv_producer), D = decode instance (kv_consumer); "
         "SCHEDULER = the connector object in the EngineCore process, WORKER = the one in "
         "the Worker process, class = classmethod (frontend/any process).", "",
         "| side/process | method | calls | first call (s after first trace) |", "|---|---|---|---|"]
    for key in sorted(first, key=lambda k: first[k]):
        L.append(f"| {key[0]} | {key[1]} | {count[key]} | {first[key] - t0:.3f} |")

    # start-up: everything before the first request
    t_req = next((r["t"] for r in recs if r["m"] == "on_new_request"), None)
    L += ["", "## Start-up calls (before the first request)", "",
          "| t (s) | side | thread | method | args | ret | ms |", "|---|---|---|---|---|---|---|"]
    for r in recs:
        if t_req is not None and r["t"] >= t_req:
            break
        if r["m"] == "has_pending_push_work":
            continue
        L.append(f"| {r['t'] - t0:.3f} | {side[r['pid']]} | {r['thread']} | {r['m']} | "
                 f"{short(r.get('args'))} | {short(r.get('ret', r.get('err')))} | {r.get('ms', '')} |")

    # one request's life: P id and D id of the first measured pair
    p_ids = [r["args"][0].get("Request") for r in recs
             if r["m"] == "on_new_request" and side[r["pid"]].startswith("P/")]
    d_ids = [r["args"][0].get("Request") for r in recs
             if r["m"] == "on_new_request" and side[r["pid"]].startswith("D/")]
    k = 1 if len(p_ids) > 1 and len(d_ids) > 1 else 0
    if p_ids and d_ids:
        ids = (p_ids[k], d_ids[k])
        L += ["", f"## One request's life: prefill id {ids[0]}, decode id {ids[1]}", "",
              "Calls whose arguments or result mention either id, in time order; the "
              "per-step calls in between are counted, not listed.", "",
              "| t (s) | side | method | args | ret | ms |", "|---|---|---|---|---|---|"]
        skipped = {}
        began = False
        for r in recs:
            if r["m"] == "build_connector_meta":   # its args name every scheduled request
                blob = json.dumps(r.get("ret"))
            else:
                blob = json.dumps(r.get("args")) + json.dumps(r.get("ret"))
            hit = ids[0] in blob or ids[1] in blob
            if not hit:
                if began:
                    key = f"{side[r['pid']]}.{r['m']}"
                    skipped[key] = skipped.get(key, 0) + 1
                continue
            began = True
            if skipped:
                L.append("| | | *(between: " + ", ".join(f"{k2} x{v}" for k2, v in skipped.items())
                         + ")* | | | |")
                skipped = {}
            L.append(f"| {r['t'] - t0:.3f} | {side[r['pid']]} | {r['m']} | {short(r.get('args'))} | "
                     f"{short(r.get('ret', r.get('err')))} | {r.get('ms', '')} |")
            if ids[1] in blob and r["m"] in ("request_finished_all_groups", "request_finished") \
                    and side[r["pid"]].startswith("D/"):
                break
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------ main
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(tempfile.gettempdir(), "hixl-vllm", "tiny-llama"))
    ap.add_argument("--connector", default="NixlConnector")
    ap.add_argument("--kv-extra", default="", help="JSON for kv_connector_extra_config")
    ap.add_argument("--p-role", default="kv_producer")
    ap.add_argument("--d-role", default="kv_consumer")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--min-len", type=int, default=100)
    ap.add_argument("--max-len", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=1, help="untimed P/D requests first (NIXL handshake)")
    ap.add_argument("--batch", type=int, default=8,
                    help="after the one-at-a-time requests, N more prompts sent together "
                         "(P all at once, then D all at once); 0 = skip")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--block-size", type=int, default=None, help="vLLM block size (CPU default 128)")
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--kv-cache-bytes", type=int, default=64 << 20,
                    help="KV cache size per instance (kv_cache_memory_bytes), default 64 MiB")
    ap.add_argument("--no-prefix-caching", action="store_true")
    ap.add_argument("--ucx-tls", default="tcp", help="UCX_TLS for the instances ('' = leave unset)")
    ap.add_argument("--ucx-net-devices", default="lo")
    ap.add_argument("--layout", choices=["split", "none"], default="split",
                    help="split: pin each instance's threads to its own CPUs after start "
                         "(--p-cpus/--d-cpus/--agg-cpus); none: leave vLLM's placement")
    ap.add_argument("--p-cpus", default="0")
    ap.add_argument("--d-cpus", default="1")
    ap.add_argument("--agg-cpus", default="1")
    ap.add_argument("--reserved-cpus", default="1",
                    help="VLLM_CPU_NUM_OF_RESERVED_CPU for the instances ('' = vLLM's default)")
    ap.add_argument("--keep-cached-key", action="store_true",
                    help="forward remote_prefill_cached_tokens to D (then D reports P's cache hits)")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--reference-cache", default=None, metavar="DIR",
                    help="keep the reference outputs per prompt here, and reuse them")
    ap.add_argument("--strict-kv-stats", action="store_true",
                    help="fail if the connector reports no transfer bytes (default: skip the bytes "
                         "checks for connectors without NIXL-style stats)")
    ap.add_argument("--trace", action="store_true",
                    help="write trace_connector records (use with --connector trace_connector:TracingConnector)")
    ap.add_argument("--kv-load-failure-policy", choices=["fail", "recompute"], default=None,
                    help="vLLM's kv_load_failure_policy for the instances (default: vLLM's, fail)")
    ap.add_argument("--fault", choices=["kill-prefill", "no-pull"], default=None,
                    help="after the warm-up, instead of the measured requests: kill-prefill = "
                         "SIGKILL the prefill instance once it handed out a request's transfer "
                         "parameters (--fault-delay-ms after the decode request was sent; "
                         "default: before), then check the decode request ends within "
                         "--fault-bound-s, failed or recomputed per --kv-load-failure-policy, "
                         "never with wrong tokens; no-pull = the decode never pulls: check the "
                         "prefill's lease expires and vLLM frees the blocks (needs a short "
                         "lease in --kv-extra, e.g. {\"lease_ms\": 2000})")
    ap.add_argument("--fault-delay-ms", type=float, default=None)
    ap.add_argument("--fault-bound-s", type=float, default=10.0,
                    help="how long the decode may take to end a request whose prefill died")
    ap.add_argument("--start-timeout", type=float, default=240)
    ap.add_argument("--req-timeout", type=float, default=120)
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-scrub", action="store_true",
                    help="keep this machine's absolute paths in the result files")
    ap.add_argument("--scrub", nargs="+", metavar="DIR", help="scrub paths in result folders, then exit")
    ap.add_argument("--summarize", nargs="+", metavar="DIR")
    ap.add_argument("--trace-report", metavar="DIR")
    # internal
    ap.add_argument("--serve", choices=["agg", "prefill", "decode"], help=argparse.SUPPRESS)
    ap.add_argument("--ctl-port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.scrub:
        for d in args.scrub:
            print(d, scrub_paths(d, os.path.abspath(args.model)), "files changed")
        return 0
    if args.summarize:
        print(summarize(args.summarize))
        return 0
    if args.trace_report:
        print(trace_report(args.trace_report))
        return 0
    if args.serve:
        args.model = os.path.abspath(args.model)
        serve(args)
        return 0
    args.model = os.path.abspath(args.model)
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        print(f"no model at {args.model}: run make_tiny_llama.py --out {args.model}", file=sys.stderr)
        return 2
    # options the instances need, passed through verbatim
    pt = ["--model", args.model, "--connector", args.connector, "--p-role", args.p_role,
          "--d-role", args.d_role, "--dtype", args.dtype, "--max-model-len", str(args.max_model_len),
          "--max-num-seqs", str(args.max_num_seqs), "--kv-cache-bytes", str(args.kv_cache_bytes)]
    if args.kv_extra:
        pt += ["--kv-extra", args.kv_extra]
    if args.block_size:
        pt += ["--block-size", str(args.block_size)]
    if args.kv_load_failure_policy:
        pt += ["--kv-load-failure-policy", args.kv_load_failure_policy]
    if args.no_prefix_caching:
        pt += ["--no-prefix-caching"]
    args.passthrough = pt
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
