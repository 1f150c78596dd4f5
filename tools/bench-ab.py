#!/usr/bin/env python3
"""Table of tools/bench-ab.sh output: per case, the median over rounds of GB/s and p50 for
binary a and b, and the ratios b/a (GB/s: higher is better; p50: lower is better)."""
import json, statistics, sys
from collections import defaultdict

rows = defaultdict(lambda: defaultdict(list))
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    key = (d.get("transport"), d.get("op"), d.get("block_bytes"), d.get("batch"))
    rows[key][d["bin"]].append(d)

def med(xs, k):
    v = [x[k] for x in xs if isinstance(x.get(k), (int, float))]
    return statistics.median(v) if v else float("nan")

print(f"{'transport':9} {'op':5} {'block':>6} {'batch':>5} | {'a GB/s':>7} {'b GB/s':>7} {'b/a':>5} | {'a p50':>8} {'b p50':>8} {'b/a':>5}")
for key in sorted(rows, key=lambda k: (k[0], k[1], k[3], k[2])):
    a, b = rows[key]["a"], rows[key]["b"]
    ga, gb = med(a, "gbps"), med(b, "gbps")
    pa, pb = med(a, "p50_us"), med(b, "p50_us")
    print(f"{key[0]:9} {key[1]:5} {key[2]:>6} {key[3]:>5} | {ga:7.2f} {gb:7.2f} {gb/ga:5.2f} | {pa:8.1f} {pb:8.1f} {pb/pa:5.2f}")
