#!/usr/bin/env bash
# hixl over RDMA verbs side by side with perftest's ib_write_bw / ib_read_bw (Debian perftest),
# on the same Soft-RoCE devices in the same boot of the guest of tools/softroce-vm.sh:
# perftest on rxe0, then `hixl bench comm --transport verbs` with one rail (rxe0) and with two
# (rxe0,rxe1), at 1 MiB and 16 MiB.
#
#   tools/verbs-bench.sh            # prints both tables; the guest's log is in $WORK/run.log
#
# In a TCG guest Soft-RoCE is the CPU's work (the kernel's rxe threads and both processes share
# two emulated vCPUs), so these figures compare hixl's verbs path with perftest's on equal
# terms; they say nothing of a real NIC's bandwidth. Needs what tools/verbs-tests.sh needs, and
# apt-get download (perftest and libpci3 are unpacked here, not installed).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/hixl-softroce}
pt=$WORK/perftest
if [ ! -x "$pt/usr/bin/ib_write_bw" ]; then
  rm -rf "$pt" && mkdir -p "$pt"
  (cd "$pt" && apt-get download perftest libpci3 >/dev/null)
  for d in "$pt"/*.deb; do dpkg-deb -x "$d" "$pt"; done
fi
libpci=$(find "$pt" -name 'libpci.so.3*' -type f | head -n 1)
[ -n "$libpci" ] || { echo "verbs-bench: libpci.so.3 not in the libpci3 package" >&2; exit 1; }
cp "$libpci" "$pt/libpci.so.3" && chmod +x "$pt/libpci.so.3"
cli=$(cargo build --release -p hixl-cli --features verbs --message-format=json |
  grep -o '"executable":"[^"]*"' | sed 's/"executable":"\(.*\)"/\1/' | grep '/hixl$' | head -n 1)
[ -n "$cli" ] || { echo "verbs-bench: the hixl command did not build" >&2; exit 1; }
WORK=$WORK tools/softroce-vm.sh build "$cli" "$pt/usr/bin/ib_write_bw" "$pt/usr/bin/ib_read_bw" \
  "$pt/libpci.so.3"
# perftest: a server and a client on rxe0, GID index 1 (its IPv4-mapped GID), one QP, the
# exchange over TCP on the loopback. -n iterations keep each run a few seconds in TCG.
cmd='export LD_LIBRARY_PATH=/extra
perf() { # tool size iterations
  $1 -d rxe0 -x 1 -s $2 -n $3 -F >/tmp/srv.log 2>&1 &
  sleep 1
  $1 -d rxe0 -x 1 -s $2 -n $3 -F 127.0.0.1 2>&1 | awk "/^ *[0-9]+ +[0-9]+ /{print \"PERFTEST $1 $2\", \$0}"
  wait
}
echo "PERFTEST columns: bytes iterations BW-peak[MB/s] BW-average[MB/s] MsgRate[Mpps]"
for t in ib_write_bw ib_read_bw; do perf $t 1048576 100; perf $t 16777216 10; done
hixl() { # label, then bench options
  echo "=== hixl $1"; shift
  /extra/hixl bench comm --transport verbs --option hixl.VerbsTimeout=18 --no-baseline "$@"
}
for rails in rxe0 rxe0,rxe1; do
  hixl "rails $rails" --option hixl.VerbsDevices=$rails --op both --blocks 1M,16M --total 16M --duration 3
done
# The defaults of hixl.VerbsQpsPerRail and hixl.VerbsSliceBytes: two rails, 16 MiB writes.
for k in 1 4; do
  hixl "qps per rail $k" --option hixl.VerbsDevices=rxe0,rxe1 --option hixl.VerbsQpsPerRail=$k --blocks 16M --total 16M --duration 3
done
for s in 64K 1M; do
  hixl "slice $s" --option hixl.VerbsDevices=rxe0,rxe1 --option hixl.VerbsSliceBytes=$s --blocks 16M --total 16M --duration 3
done'
WORK=$WORK tools/softroce-vm.sh run "$cmd"
