#!/usr/bin/env bash
# Same-run A/B of two hixl binaries: `hixl bench comm` over tcp and fabric, READ and WRITE,
# 4K/64K/1M/16M blocks, batch 1 and batch 32, the two binaries alternating case by case for
# ROUNDS rounds, so that both see the same machine. Prints one JSON line per measurement
# (with "bin": "a"|"b" added) to stdout; tools/bench-ab.py turns them into a table.
#
#   tools/bench-ab.sh OLD_HIXL NEW_HIXL [ROUNDS] > ab.jsonl && python3 tools/bench-ab.py ab.jsonl
set -euo pipefail
a=$1 b=$2 rounds=${3:-3}
for r in $(seq "$rounds"); do
  for tr in tcp fabric; do
    for batch in 1 32; do
      for bin in a b; do
        exe=$a; [ "$bin" = b ] && exe=$b
        "$exe" bench comm --transport "$tr" --op both --blocks 4K,64K,1M,16M --batch "$batch" \
          --duration 1 --no-baseline --json | sed "s/^{/{\"bin\":\"$bin\",\"round\":$r,/"
      done
    done
  done
done
