#!/usr/bin/env python3
"""SGLang's PD-disaggregation transfer path, driven with SGLang's own code (no model): a
bootstrap server started as SGLang's prefill server starts it, prefill and decode scheduler
ranks as separate processes, each with SGLang's token-to-KV pool on CPU tensors, its KV
manager, and the sender / receiver calls of SGLang's schedulers (``_rank.py`` lists them).
Every page is checked byte for byte on the decode (``--verify``), and the aux slot with it.

    pd_harness.py --backend hixl [--transport tcp|fabric] [--model tiny|tiny-mla|...]
                  [--prefill-tp 1] [--decode-tp 1] [--requests 64] [--tokens 512]
                  [--fault kill-prefill|kill-decode|decode-abort] [--json OUT] [--hosts]

``--backend mooncake_tcp`` runs SGLang's Mooncake backend (mooncake-transfer-engine-non-cuda,
TCP) through the same calls. ``--hosts`` puts the prefill server (bootstrap server and ranks)
and the decode ranks in different hosts of ``tools/hosts.sh``'s rig (``_hosts.py``). Exit
status 0 when every check holds: each request succeeded with every byte right (or, under a
fault, ended as the fault says within its bound), every page and aux slot returned to its free
list, no process hung (and with ``--hosts``, each engine advertised its host's address and the
links ran over tcp).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _hosts  # noqa: E402


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="hixl", help="hixl, mooncake_tcp, mooncake")
    p.add_argument("--transport", default="", help="hixl's transport (HIXL_SGLANG_TRANSPORT)")
    p.add_argument("--model", default="tiny")
    p.add_argument("--prefill-tp", type=int, default=1)
    p.add_argument("--decode-tp", type=int, default=1)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--tokens", type=int, default=512, help="prompt tokens per request (mean)")
    p.add_argument("--page", type=int, default=16)
    p.add_argument("--window", type=int, default=8, help="requests in flight per rank")
    p.add_argument("--pool-tokens", type=int, default=0, help="default: window x 2 x tokens")
    p.add_argument("--slots", type=int, default=0, help="aux slots (default: 2 x window)")
    p.add_argument("--chunks", type=int, default=2, help="sends per request (chunked prefill)")
    p.add_argument("--no-verify", dest="verify", action="store_false")
    p.add_argument("--fault", default="", choices=["", "kill-prefill", "kill-decode",
                                                           "decode-abort"])
    p.add_argument("--tick", type=float, default=0.0005, help="scheduler loop sleep (s)")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", default="", help="write the summary here")
    p.add_argument("--log-dir", default="", help="each rank's stderr (default: a temp dir)")
    p.add_argument("--hosts", action="store_true",
                   help="prefill (and bootstrap) in host h1, decode in h2 (_hosts.py)")
    # a rank process (started by the driver)
    p.add_argument("--role", default="", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--reqs", default="[]", help=argparse.SUPPRESS)
    p.add_argument("--bootstrap-port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--bootstrap-host", default="127.0.0.1", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", default="", help=argparse.SUPPRESS)
    p.add_argument("--abort-rooms", default="[]", type=json.loads, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.hosts and not a.role and a.backend != "hixl":
        p.error("--hosts runs the hixl backend only")
    a.pool_tokens = a.pool_tokens or a.window * 2 * (a.tokens * 2 + a.page)
    if a.fault in ("kill-prefill", "kill-decode"):  # every request starts before the kill
        a.window = max(a.window, a.requests)
    a.slots = a.slots or 2 * a.window
    if not a.role and not a.log_dir:
        a.log_dir = tempfile.mkdtemp(prefix="hixl-sgl-logs-")
    if not a.role:
        os.makedirs(a.log_dir, exist_ok=True)
    return a


def model_dir(model: str) -> str:
    """A model folder SGLang's ServerArgs can read (a config, no weights: nothing runs it)."""
    d = Path(tempfile.mkdtemp(prefix="hixl-sgl-model-"))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
           "intermediate_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8,
           "num_hidden_layers": 4, "vocab_size": 1024, "max_position_embeddings": 4096,
           "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5}
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Rank:
    def __init__(self, args: argparse.Namespace, role: str, rank: int, reqs: List[Dict[str, Any]],
                 extra: List[str], env: Dict[str, str], wrap: Optional[List[str]] = None) -> None:
        # wrap: the command that runs it in its host (--hosts)
        cmd = [*(wrap or []), sys.executable, str(HERE / "pd_harness.py"), *extra, "--role", role,
               "--rank", str(rank), "--reqs", json.dumps(reqs)]
        self.role, self.rank, self.lines = role, rank, []  # type: ignore[var-annotated]
        self.ready = threading.Event()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.err: List[str] = []
        self.log = os.path.join(args.log_dir, f"{role}{rank}.log")
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            self.lines.append(ev)
            if ev.get("event") == "stages" and os.environ.get("PD_HARNESS_LOG"):
                print(f"{self.role} {self.rank}: {ev['stages']}", flush=True)
            if ev.get("event") == "ready":
                self.ready.set()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        with open(self.log, "w") as f:
            for line in self.proc.stderr:
                f.write(line)
                f.flush()
                self.err.append(line.rstrip())
                del self.err[:-200]

    def reqs(self) -> List[Dict[str, Any]]:
        return [e for e in self.lines if e.get("event") == "req"]

    def summary(self) -> Optional[Dict[str, Any]]:
        return next((e for e in self.lines if e.get("event") == "summary"), None)


def pct(xs: List[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def drive(args: argparse.Namespace) -> int:
    if not args.hosts:
        return _drive(args, None)
    with _hosts.Rig() as rig:
        return _drive(args, rig)


def _drive(args: argparse.Namespace, rig: Any) -> int:
    os.environ.setdefault("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "2")
    os.environ.setdefault("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", "2")
    if args.transport:
        os.environ["HIXL_SGLANG_TRANSPORT"] = args.transport
    if args.fault == "kill-decode":
        # a prefill request whose decode died before sending its pages ends after this long
        os.environ.setdefault("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "5")
    if args.fault == "kill-prefill":
        # a dead prefill never acks: the pages it might have written are held this long
        os.environ.setdefault("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", "5")
    if args.fault == "decode-abort":
        # decode holds an aborted request's pages until the prefill acks it stopped writing
        os.environ["SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"] = "1"
    if args.backend == "mooncake_tcp":
        os.environ.setdefault("MC_FORCE_TCP", "1")
    port = free_port()
    mdir = model_dir(args.model)
    rng = random.Random(1)
    reqs = [{"room": rng.getrandbits(62), "tokens": max(1, int(args.tokens * rng.uniform(0.5, 1.5)))}
            for _ in range(args.requests)]
    abort_rooms = [r["room"] for r in reqs[1::4]] if args.fault == "decode-abort" else []
    extra = list(sys.argv[1:]) + ["--bootstrap-port", str(port), "--model-dir", mdir,
                                         "--abort-rooms", json.dumps(abort_rooms)]
    if rig is not None:
        extra += ["--bootstrap-host", rig.addr("bootstrap")]
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{HERE}{os.pathsep}{env.get('PYTHONPATH', '')}"

    def start(role: str, rank: int, reqs: List[Dict[str, Any]]) -> Rank:
        if rig is None:
            return Rank(args, role, rank, reqs, extra, env)
        return Rank(args, role, rank, reqs, extra, rig.env(role, env), rig.wrap(role))

    # The prefill server's main process (the bootstrap server), then the scheduler ranks.
    boot = start("bootstrap", 0, [])
    ranks: List[Rank] = []
    try:
        if not boot.ready.wait(120):
            print(f"the bootstrap server did not start; its log: {boot.log}", file=sys.stderr)
            return 1
        ranks = [start("prefill", r, reqs) for r in range(args.prefill_tp)]
        ranks += [start("decode", r, reqs) for r in range(args.decode_tp)]
        killed_at, rc = run(args, boot, ranks)
    finally:  # no process outlives the driver (nor the rig it ran in)
        for r in ranks + [boot]:
            if r.proc.poll() is None:
                r.proc.kill()
            r.proc.wait()
    problems: List[str] = []
    if rig is not None:
        print(f"across hosts: {_hosts.describe(ranks)}")
        problems = _hosts.check(rig, ranks)
    return report(args, ranks, abort_rooms, killed_at, rc, problems)


def run(args: argparse.Namespace, boot: Rank,
        ranks: List[Rank]) -> Tuple[Optional[float], int]:
    """Waits for the ranks to end, killing one side when ``--fault`` says; returns when it
    killed (None if it did not) and 1 if a process hung, else 0."""
    deadline = time.monotonic() + args.timeout
    killed_at = None
    rc = 0
    while any(r.proc.poll() is None for r in ranks):
        if time.monotonic() > deadline:
            print(f"TIMEOUT after {args.timeout}s: a process hung", file=sys.stderr)
            for r in ranks:  # where each unfinished rank's requests were (stage/poll: count)
                last = [e for e in r.lines if e.get("event") == "stages"][-1:]
                if r.proc.poll() is None and last:
                    print(f"  {r.role} {r.rank}: {last[0]['stages']} {last[0]['rooms']}",
                          file=sys.stderr)
            rc = 1
            break
        if args.fault == "kill-decode" and killed_at is None:
            done = min(len(r.reqs()) for r in ranks if r.role == "prefill")
            if done >= max(1, args.requests // 8):
                for r in ranks:
                    if r.role == "decode":
                        os.kill(r.proc.pid, signal.SIGKILL)
                killed_at = time.monotonic()
        if args.fault == "kill-prefill" and killed_at is None:
            done = min(len(r.reqs()) for r in ranks if r.role == "decode")
            # and every prefill rank said where its link goes (the ranks' records)
            linked = args.backend != "hixl" or all(
                any(e.get("event") == "links" for e in r.lines)
                for r in ranks if r.role == "prefill")
            if done >= args.requests // 4 and linked:
                for r in ranks + [boot]:  # the whole prefill server
                    if r.role in ("prefill", "bootstrap"):
                        os.kill(r.proc.pid, signal.SIGKILL)
                killed_at = time.monotonic()
                print(f"killed the prefill server at {time.strftime('%H:%M:%S')}", flush=True)
        time.sleep(0.05)
    return killed_at, rc


def report(args: argparse.Namespace, ranks: List[Rank], abort_rooms: List[int],
           killed_at: Optional[float], rc: int, problems: List[str]) -> int:
    dec = [e for r in ranks if r.role == "decode" for e in r.reqs()]
    pre = [e for r in ranks if r.role == "prefill" for e in r.reqs()]
    for r in ranks:
        s = r.summary()
        for e in r.lines:
            if e.get("event") == "error":
                problems.append(f"{r.role} {r.rank}: {e['error']}")
        if (args.fault == "kill-prefill" and r.role == "prefill") or (
                args.fault == "kill-decode" and r.role == "decode"):
            continue
        if s is None:
            problems.append(f"{r.role} {r.rank} did not finish (exit {r.proc.returncode}); "
                            f"its log: {r.log}")
        elif s.get("late_writes"):
            problems.append(f"decode {r.rank}: bytes landed after release: {s['late_writes']}")
        elif s["free_pages"] != s["total_pages"]:
            problems.append(f"{r.role} {r.rank}: {s['total_pages'] - s['free_pages']} pages "
                            "never freed")
    ok_dec = [e for e in dec if e["ok"]]
    for e in dec:
        if not e["ok"] and not e.get("aborted") and args.fault != "kill-prefill":
            problems.append(f"decode room {e['room']}: {e.get('why')} {e.get('bad')}")
        if e.get("bad"):
            problems.append(f"decode room {e['room']}: wrong bytes: {e['bad']}")
    if args.fault == "decode-abort":
        for e in dec:
            if e.get("aborted") and e["ok"]:
                problems.append(f"aborted room {e['room']} reported Success")
            if e.get("released_by") == "timeout":
                problems.append(f"room {e['room']}: pages released by timeout, not by acks")
    if args.fault == "kill-prefill":
        failed = [e for e in dec if not e["ok"]]
        if not failed:
            problems.append("no decode request failed after the prefill was killed")
        # SGLang's bounds: heartbeats every 2 s, 2 misses (in flight); a request not yet
        # bootstrapped is aborted after 15 tries a second apart
        assert killed_at is not None
        late = [e for e in failed if e["t_failed"] - killed_at > 20.0]
        if late:
            problems.append(f"{len(late)} requests reached Failed more than 20 s after the kill")
        ends = sorted(round(e["t_failed"] - killed_at, 1) for e in failed)
        print(f"after the kill: Failed after (s): {ends}")
        why = sorted({(e.get("why") or "")[:120] for e in failed})
        print(f"after the kill: {len(failed)} requests Failed; causes: {why}")
    if args.fault == "kill-decode":
        failed = [e for e in pre if not e["ok"]]
        if not failed:
            problems.append("no prefill request failed after the decode was killed")
        why = sorted({(e.get("why") or "").split("): ", 1)[-1][:160] for e in failed})
        print(f"after the kill: {len(failed)} prefill requests Failed; causes: {why}")
        if len(pre) != args.requests * args.prefill_tp:
            problems.append(f"prefill reported {len(pre)} of "
                            f"{args.requests * args.prefill_tp} requests")
        if args.backend == "hixl" and not any(
                w in (e.get("why") or "") for e in failed
                for w in ("peer lost", "timeout:", "Connection refused", "refused by")):
            problems.append("no failure names hixl's cause")
    expected = args.requests * args.decode_tp
    if args.fault == "kill-decode":
        pass
    elif len(dec) != expected:
        problems.append(f"decode reported {len(dec)} of {expected} requests")
    ms = [e["ms"] for e in pre if e["ok"]]
    total_bytes = sum(e["bytes"] or 0 for e in pre if e["ok"])
    wall = max((r.summary() or {}).get("wall_s", 0) for r in ranks)
    summary = {
        "backend": args.backend, "transport": args.transport or "auto", "model": args.model,
        "prefill_tp": args.prefill_tp, "decode_tp": args.decode_tp, "requests": args.requests,
        "tokens": args.tokens, "ok": len(ok_dec), "decode_reqs": len(dec),
        "p50_ms": pct(ms, 0.5), "p99_ms": pct(ms, 0.99),
        "mean_ms": statistics.fmean(ms) if ms else float("nan"),
        "gbps": total_bytes / wall / 1e9 if wall else 0.0, "bytes": total_bytes,
        "wall_s": wall, "hosts": bool(args.hosts), "problems": problems,
    }
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    for p in problems:
        print("PROBLEM:", p, file=sys.stderr)
    return 1 if (problems or rc) else 0


if __name__ == "__main__":
    a = parse()
    if a.role:
        import _rank

        _rank.main(a)
    else:
        sys.exit(drive(a))
