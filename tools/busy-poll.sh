#!/usr/bin/env bash
# hixl's 4 KiB TCP round trip at the default spin and in busy-poll mode (hixl.SpinUs=1000000),
# alternating with sockperf's busy-poll ping-pong (64 B and 4 KiB, server cpu0, client cpu1,
# --nonblocked) so that every figure of a round comes from the same minute.
#
#   tools/busy-poll.sh [HIXL_BIN] [ROUNDS]        (needs sockperf: apt-get install sockperf)
set -euo pipefail
bin=${1:-target/release/hixl} rounds=${2:-3}
for r in $(seq "$rounds"); do
  # 64 B is the yardstick of the busy-poll target; 4 KiB is the floor for a 4 KiB op. One
  # server echoes both.
  taskset -c 0 timeout 30 sockperf sr --tcp -i 127.0.0.1 -p 11299 --nonblocked >/dev/null 2>&1 &
  sp=$!
  sleep 0.5
  for size in 64 4096; do
    out=$(taskset -c 1 timeout 20 sockperf pp --tcp -i 127.0.0.1 -p 11299 -t 3 -m "$size" --nonblocked 2>&1)
    half=$(echo "$out" | grep -oP 'percentile 50.000 =\s*\K[0-9.]+')
    echo "round $r: sockperf busy-poll $size B RTT p50 $(python3 -c "print(round(2 * $half, 1))") us"
  done
  kill "$sp" 2>/dev/null; wait "$sp" 2>/dev/null || true
  for op in write read; do
    for spin in 50 1000000; do
      "$bin" bench comm --transport tcp --op "$op" --blocks 4K --batch 1 --duration 1 \
        --spin-us "$spin" --no-baseline --json | python3 -c "
import json, sys
d = json.loads(sys.stdin.readline())
print('round $r: hixl $op 4K spin $spin: p50', round(d['p50_us'], 1), 'us, p99', round(d['p99_us'], 1), 'us')"
    done
  done
done
