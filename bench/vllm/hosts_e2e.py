#!/usr/bin/env python3
"""vLLM prefill/decode across hosts over HTTP: the prefill's `vllm serve` in host h1, the
decode's in h2, `python -m hixl.vllm.proxy` and this client in h3, etcd in h4 (hosts of
tools/hosts.sh's rig: network namespaces with their own addresses on a bridge; no process
sees another host's addresses, and `lo` is not the path between them). No address is
configured: each worker advertises the one it detects (VLLM_HOST_IP is unset), and listens on
a fixed port (the connector's `port`). Every answer through the proxy is compared token for
token with a single server's.

    hosts_e2e.py --model DIR [--rate 20mbit] [--phases address,directory,loopback] [--out DIR]

Phases (each a fresh pair of servers):
  address    the decode links to the prefill by the address it advertised. Three passes of the
             same prompts: plain; with the A-B link 1 ms each way and capped at --rate (the
             pulls' time grows as the cap says: bytes / xfer time within the cap); and with
             h1's link taken down while a pull is in flight and brought up once the decode
             reported it (every request ends, the answers that come back are exact, the
             decode recomputed the failed ones and serves the next pass exactly).
  directory  both publish in etcd (in h4) by name and the decode links by name
             (kv_connector_extra_config names the directory only).
  loopback   the prefill is misconfigured to advertise 127.0.0.1: the decode refuses it
             naming both addresses, recomputes, and every answer is still exact.
Exit status 0 when every check of every phase holds. Needs root, the rig's tools (iproute2,
nftables), etcd, and the vLLM venv with hixl installed.
"""
import argparse
import concurrent.futures
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_e2e as se  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
HOSTS = os.path.join(ROOT, "tools", "hosts.sh")
API, PROXY, DATA, ETCD = 8100, 8000, 27000, 2379


def hosts(*args):
    subprocess.run([HOSTS, *args], check=True)


class Rig:
    def __init__(self):
        self.prefix = os.environ.get("HIXL_HOSTS_PREFIX", "hx")
        self.net = os.environ.get("HIXL_HOSTS_NET", "192.0.2")

    def ns(self, h):
        return f"{self.prefix}-{h}"

    def addr(self, h):
        return f"{self.net}.{h[1:]}"


def metric(host, port, name):
    return se.metric(se.get_json(f"http://{host}:{port}/metrics"), name)


def log_since(path, offset):
    with open(path) as f:
        f.seek(offset)
        return f.read()


def size(path):
    return os.path.getsize(path) if os.path.exists(path) else 0


def run_prompts(rig, args, prompts, width=1):
    """Each prompt through the proxy: the token ids, or an error string."""
    px = rig.addr("h3")

    def one(pr):
        try:
            return se.stream(PROXY, args.model, pr, args.max_tokens, addr=px)[0]
        except (urllib.error.HTTPError, OSError) as e:
            return f"error: {e}"
    with concurrent.futures.ThreadPoolExecutor(width) as pool:
        return list(pool.map(one, prompts))


def start_pair(rig, args, srv, extra, prefill_env=None):
    base = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    kv = {"kv_connector": "HixlConnector", "kv_connector_module_path": "hixl.vllm",
          "kv_connector_extra_config": extra}
    pre = srv.start("prefill", se.vllm_cmd(args, API, dict(kv, kv_role="kv_producer")),
                    dict(base, VLLM_CPU_OMP_THREADS_BIND="0", **(prefill_env or {})), API,
                    netns=rig.ns("h1"), env_drop=() if prefill_env else ("VLLM_HOST_IP",))
    # a pull that fails is recomputed (vLLM's default fails the request)
    dec = srv.start("decode", se.vllm_cmd(args, API, dict(kv, kv_role="kv_consumer",
                                                          kv_load_failure_policy="recompute")),
                    dict(base, VLLM_CPU_OMP_THREADS_BIND="1",
                                      HIXL_VLLM_TRACE=os.path.join(srv.out, "trace")),
                    API, netns=rig.ns("h2"), env_drop=("VLLM_HOST_IP",))
    prox = srv.start("proxy", [sys.executable, "-m", "hixl.vllm.proxy", "--port", str(PROXY),
                               "--prefill", f"http://{rig.addr('h1')}:{API}",
                               "--decode", f"http://{rig.addr('h2')}:{API}",
                               "--timeout-s", "120"], {}, PROXY)
    for name, (proc, log, port), h in (("prefill", pre, "h1"), ("decode", dec, "h2"),
                                       ("proxy", prox, "h3")):
        se.wait_healthy(name, proc, port, log, 300, addr=rig.addr(h))
    return pre, dec


def phase_address(rig, args, srv, prompts, ref, checks, res):
    _, dec = start_pair(rig, args, srv, {"port": DATA})
    d = rig.addr("h2")
    got = run_prompts(rig, args, prompts)
    checks["address: plain exact"] = got == ref
    text = open(dec[1]).read()
    checks["address: detected addresses, fixed port, tcp between hosts"] = (
        f"linked to prefill worker {rig.addr('h1')}:{DATA} (cluster" in text
        and re.search(r"linked to prefill worker \S+ \(cluster \d+\) over tcp", text) is not None)
    b0, t0 = (metric(d, API, "vllm:hixl_bytes_transferred_sum"),
              metric(d, API, "vllm:hixl_xfer_time_seconds_sum"))
    checks["address: bytes moved"] = b0 > 0
    m = se.get_json(f"http://{d}:{API}/metrics")
    local = se.metric(m, "vllm:prompt_tokens_by_source_total", source="local_compute")
    checks["address: the decode computed no prompt (at most a token a request)"] = (
        local <= len(prompts)
        and se.metric(m, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") > 0)
    # The A-B link 1 ms each way and capped: the pulls take as long as the cap says.
    hosts("shape", "h1", "rate", args.rate, "delay", "1ms")
    got = run_prompts(rig, args, prompts)
    checks["address: capped exact"] = got == ref
    b1, t1 = (metric(d, API, "vllm:hixl_bytes_transferred_sum"),
              metric(d, API, "vllm:hixl_xfer_time_seconds_sum"))
    bits = float(re.match(r"([0-9.]+)mbit", args.rate).group(1)) * 1e6
    gbps = (b1 - b0) * 8 / max(t1 - t0, 1e-9)
    res["capped"] = {"rate": args.rate, "delay": "1ms each way", "bytes": b1 - b0,
                     "xfer_s": round(t1 - t0, 3),
                     "measured_mbit": round(gbps / 1e6, 2),
                     "uncapped_mbit": round(b0 * 8 / max(t0, 1e-9) / 1e6, 1)}
    # under the cap (a token bucket lets a 32 KiB burst through at line rate), and near it
    checks["address: pulls keep to the cap"] = 0.5 * bits <= gbps <= 1.3 * bits
    # The prefill's link down while a pull is in flight; up once the decode reported it.
    trace = os.path.join(srv.out, "trace")
    tr0, lg0 = size(trace), size(dec[1])
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(run_prompts, rig, args, prompts, 4)
        end = time.monotonic() + 120
        while " start " not in log_since(trace, tr0) and time.monotonic() < end:
            time.sleep(0.01)
        t_down = time.monotonic()
        hosts("link", "h1", "down")
        while time.monotonic() < end:
            if "KV load failure" in log_since(dec[1], lg0) or fut.done():
                break
            time.sleep(0.05)
        down_s = time.monotonic() - t_down
        hosts("link", "h1", "up")
        try:
            got = fut.result(timeout=300)
        except concurrent.futures.TimeoutError:
            got = None
    checks["address: link down, every request ended"] = got is not None
    answered = [g for g in (got or []) if not isinstance(g, str)]
    exact = all(g == r for g, r in zip(got or [], ref) if not isinstance(g, str))
    failed_log = log_since(dec[1], lg0)
    res["link_down"] = {"down_s": round(down_s, 2), "answered": len(answered),
                        "errors": [g for g in (got or []) if isinstance(g, str)][:3],
                        "load_failures": failed_log.count("KV load failure")}
    checks["address: link down, answers exact"] = exact
    # a request the proxy could not complete is a 502 naming the upstream, not a bare 500
    checks["address: link down, failures named"] = all(
        "502" in g for g in (got or []) if isinstance(g, str))
    checks["address: link down, the decode reported the failure"] = (
        "KV load failure" in failed_log)
    hosts("shape", "h1")
    got = run_prompts(rig, args, prompts)
    checks["address: after the link is back, exact"] = got == ref


def entries_gone(rig, within_s=30.0):
    """True once etcd holds no engine entry (a killed engine's lives until its lease's TTL)."""
    end = time.monotonic() + within_s
    while True:
        out = subprocess.run(["etcdctl", "--endpoints", f"http://{rig.addr('h4')}:{ETCD}",
                              "get", "--prefix", "/hixl/engines/", "--keys-only"],
                             capture_output=True, text=True)
        if out.returncode == 0 and not out.stdout.strip():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.2)


def phase_directory(rig, args, srv, prompts, ref, checks, res):
    _, dec = start_pair(rig, args, srv, {"directory": f"etcd://{rig.addr('h4')}:{ETCD}"})
    got = run_prompts(rig, args, prompts)
    checks["directory: exact"] = got == ref
    text = open(dec[1]).read()
    named = re.findall(r"linked to prefill worker (\S+) \(cluster", text)
    res["directory_links"] = named
    checks["directory: linked by name"] = bool(named) and all(":" not in n for n in named)


def phase_loopback(rig, args, srv, prompts, ref, checks, res):
    _, dec = start_pair(rig, args, srv, {}, prefill_env={"VLLM_HOST_IP": "127.0.0.1"})
    got = run_prompts(rig, args, prompts[:2])
    checks["loopback: exact (recomputed)"] = got == ref[:2]
    text = open(dec[1]).read()
    want = (f"advertises the loopback address 127.0.0.1, but this side advertises "
            f"{rig.addr('h2')}")
    checks["loopback: refused naming both addresses"] = want in text


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--block-size", type=int, default=None)
    ap.add_argument("--rate", default="20mbit", help="the A-B link's cap, in mbit")
    ap.add_argument("--phases", default="address,directory,loopback")
    ap.add_argument("--reference-cache", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--in-rig", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="hixl-hosts-e2e-")
    os.makedirs(out, exist_ok=True)
    if not args.in_rig:
        # The rig's owner: up, this script again in h3, down whatever happens.
        rig = Rig()
        hosts("up", "4")
        etcd = None
        try:
            data = tempfile.mkdtemp(prefix="hixl-hosts-etcd-")
            a4 = rig.addr("h4")
            etcd = subprocess.Popen(
                ["ip", "netns", "exec", rig.ns("h4"), shutil.which("etcd") or "etcd",
                 "--data-dir", data, "--listen-client-urls", f"http://{a4}:{ETCD}",
                 "--advertise-client-urls", f"http://{a4}:{ETCD}",
                 "--listen-peer-urls", f"http://{a4}:2380"],
                stdout=open(os.path.join(out, "etcd.log"), "w"), stderr=subprocess.STDOUT)
            argv = [a for a in sys.argv[1:]] + ["--in-rig", "--out", out]
            return subprocess.run(["ip", "netns", "exec", rig.ns("h3"), sys.executable,
                                   os.path.abspath(__file__), *argv]).returncode
        finally:
            if etcd is not None:
                etcd.terminate()
                etcd.wait()
            hosts("down")
    rig = Rig()
    rng = random.Random(1)
    prompts = [[rng.randrange(1, 500) for _ in range(rng.randint(100, 200))]
               for _ in range(args.num_prompts)]
    ref = se.reference(args, prompts, out, se.Servers(out))
    checks, res = {}, {}
    phases = {"address": phase_address, "directory": phase_directory,
              "loopback": phase_loopback}
    for name in args.phases.split(","):
        sub = os.path.join(out, name)
        os.makedirs(sub, exist_ok=True)
        srv = se.Servers(sub)
        t0 = time.monotonic()
        try:
            phases[name](rig, args, srv, prompts, ref, checks, res)
        except (Exception, SystemExit) as e:  # the phase fails; the others still run
            checks[f"{name}: ran"] = False
            res[f"{name}_error"] = repr(e)
            traceback.print_exc()
        finally:
            srv.stop()
            hosts("link", "h1", "up")
            hosts("shape", "h1")
        if name == "directory":
            # vLLM's shutdown kills its workers at once (--shutdown-timeout 0), often before
            # a connector has taken its entry out of etcd: then the entry ends with its lease
            checks["directory: no entry left after the servers stopped"] = entries_gone(rig)
        else:
            checks[f"{name}: both connectors closed on SIGTERM"] = all(
                os.path.exists(os.path.join(sub, f"{n}.log"))
                and se.closed_on_sigterm(os.path.join(sub, f"{n}.log"))
                for n in ("prefill", "decode"))
        res[f"{name}_s"] = round(time.monotonic() - t0, 1)
        print(f"== phase {name}: {res[f'{name}_s']} s; checks so far {checks}", flush=True)
    res["checks"] = checks
    print(json.dumps(res, indent=1))
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    ok = bool(checks) and all(checks.values())
    print(f"hosts e2e: {'PASS' if ok else 'FAIL'} ({out})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
