"""What the Python layer costs: the same cases through `hixl` (Python) and `hixl bench comm`
(Rust) in one run, on this machine.

    python overhead.py --hixl-bin ../../../target/release/hixl [--duration 2] [--rounds 3]

For each transport (tcp, fabric): batch-1 WRITE of 4 KiB (p50 per call, `await` and `.wait()`),
1 MiB and 16 MiB (GB/s), against the Rust bench's figures for the same case; and the submit
time of an 8192-descriptor N×3 uint64 array.

Both sides write to the same target, another process (`hixl bench comm --target`; fabric: its
pool memory, as the Rust bench's own target registers), from a page-aligned source (as the
Rust bench's), and the cases alternate: each round measures Rust, then Python with `await`,
then with `.wait()`, so a slow stretch of the machine hits all three. Figures are medians over
the rounds; each round's figures are in the JSON line.
"""

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time

import numpy as np

import hixl

TARGET = r"""
import sys, hixl
size = int(sys.argv[2])
e = hixl.Engine("127.0.0.1:0", {"hixl.Transport": sys.argv[1]})
if sys.argv[1] == "fabric":
    e.register_pooled(size, name="buf")
else:
    b = bytearray(size); e.register(b, name="buf")
print(e.local_engine, flush=True)
sys.stdin.read()
"""


def rust(bin_, transport, block, duration, target):
    out = subprocess.run([bin_, "bench", "comm", "--transport", transport, "--op", "write",
                          "--blocks", block, "--batch", "1", "--json", "--no-baseline",
                          "--duration", str(duration), "--target", target],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def aligned(n):
    """n bytes of page-aligned host memory (ones), like the Rust bench's source buffer."""
    raw = np.ones(n + 4096, dtype=np.uint8)
    off = (-raw.ctypes.data) % 4096
    return raw[off:off + n]


def measure(peer, descs, duration, mode):
    lat = []
    end = time.perf_counter() + duration
    if mode == "wait":
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            peer.write(descs).wait()
            lat.append(time.perf_counter() - t0)
    else:
        async def go():
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                await peer.write(descs)
                lat.append(time.perf_counter() - t0)
        asyncio.run(go())
    return lat


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hixl-bin", required=True)
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--transports", default="tcp,fabric")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    med = statistics.median
    rows = []
    for tr in a.transports.split(","):
        child = subprocess.Popen([sys.executable, "-c", TARGET, tr, str(64 << 20)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        addr = child.stdout.readline().strip()
        eng = hixl.Engine("127.0.0.1", {"hixl.Transport": tr})
        src = aligned(64 << 20)
        reg = eng.register(src)
        peer = eng.connect(addr, 5.0).wait()
        rr = peer.region("buf")
        for block, size in (("4K", 4096), ("1M", 1 << 20), ("16M", 16 << 20)):
            d = [(reg.addr, rr.addr, size)]
            measure(peer, d, 0.2, "await")  # warm-up
            runs = {"rust": [], "await": [], "wait": []}
            for _ in range(a.rounds):
                r = rust(a.hixl_bin, tr, block, a.duration, addr)
                runs["rust"].append((r["p50_us"], r["gbps"]))
                for mode in ("await", "wait"):
                    lat = measure(peer, d, a.duration, mode)
                    runs[mode].append((med(lat) * 1e6, len(lat) * size / sum(lat) / 1e9))
            rust_p50 = med(x[0] for x in runs["rust"])
            rust_gbps = med(x[1] for x in runs["rust"])
            for mode in ("await", "wait"):
                rows.append({"transport": tr, "block": block, "mode": mode,
                             "py_p50_us": med(x[0] for x in runs[mode]), "rust_p50_us": rust_p50,
                             "py_gbps": med(x[1] for x in runs[mode]), "rust_gbps": rust_gbps,
                             "rounds": {"rust": runs["rust"], "py": runs[mode]}})
        # 8192 descriptors of 4 KiB as an N×3 array: the submit call alone, then the transfer
        n = 8192
        arr = np.empty((n, 3), dtype=np.uint64)
        arr[:, 0] = reg.addr + np.arange(n, dtype=np.uint64) * 4096
        arr[:, 1] = rr.addr + np.arange(n, dtype=np.uint64) * 4096
        arr[:, 2] = 4096
        subs = []
        for _ in range(100):
            t0 = time.perf_counter()
            t = peer.write(arr)
            subs.append(time.perf_counter() - t0)
            t.wait(10)
        rows.append({"transport": tr, "block": "8192x4K array", "mode": "submit",
                     "py_submit_us": statistics.median(subs) * 1e6})
        eng.close()
        child.stdin.close()
        child.wait()
    print(f"{'transport':9} {'case':14} {'mode':6} {'py p50 µs':>10} {'rust p50 µs':>11} {'Δ µs':>7} {'py GB/s':>8} {'rust GB/s':>9} {'ratio':>6}")
    for r in rows:
        if r["mode"] == "submit":
            print(f"{r['transport']:9} {r['block']:14} submit {r['py_submit_us']:10.1f}")
            continue
        print(f"{r['transport']:9} {r['block']:14} {r['mode']:6} {r['py_p50_us']:10.2f} {r['rust_p50_us']:11.2f} "
              f"{r['py_p50_us'] - r['rust_p50_us']:7.2f} {r['py_gbps']:8.2f} {r['rust_gbps']:9.2f} {r['py_gbps'] / r['rust_gbps']:6.3f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
