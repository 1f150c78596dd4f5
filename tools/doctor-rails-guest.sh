#!/bin/sh
# `hixl doctor` over verbs with two rails (rxe0 and rxe1), run inside the Soft-RoCE guest by
# tools/verbs-tests.sh (busybox sh, the command at /extra/hixl): a healthy pair expecting verbs
# names nothing wrong; with rxe1's link (dummy1) taken down while the probe runs, doctor names
# `rail-down` and exits 3. Exit status 0 when both hold.
set -u
hixl=/extra/hixl
# verbs forced (one host: auto would take the fabric), the ACK timeout of a TCG guest
opt="--option hixl.Transport=verbs --option hixl.VerbsDevices=rxe0,rxe1 --option hixl.VerbsTimeout=18"
probe="--size 1M --block 256K --duration 0.3"
until_in() { # until_in FILE TEXT: waits (up to 60 s) until FILE holds TEXT
  n=0
  until grep -q "$2" "$1" 2>/dev/null || [ $n -ge 600 ]; do sleep 0.1; n=$((n + 1)); done
  grep -q "$2" "$1" 2>/dev/null
}
# shellcheck disable=SC2086 # opt and probe are words
$hixl doctor --serve --listen 127.0.0.1:0 $opt >/tmp/doctor-serve.out 2>/tmp/doctor-serve.err &
ds=$!
if ! until_in /tmp/doctor-serve.out LISTENING; then
  echo "doctor-rails: hixl doctor --serve did not start"; cat /tmp/doctor-serve.err; kill $ds; exit 1
fi
peer=$(sed -n 's/.*LISTENING engine=\([^ ]*\).*/\1/p' /tmp/doctor-serve.out)
rc=0
echo "--- doctor-rails: a healthy pair, two rails, verbs expected"
# Soft-RoCE in a TCG guest is RDMA emulated in software, about a quarter of TCP over lo here:
# the one finding a healthy pair may have in this guest is slow-path.
# shellcheck disable=SC2086
$hixl doctor --peer "$peer" --expect verbs $opt $probe >/tmp/doctor-ok.out
hrc=$?
cat /tmp/doctor-ok.out
if [ $hrc != 0 ] && { [ $hrc != 3 ] || grep '^WRONG' /tmp/doctor-ok.out | grep -qv '\[slow-path\]'; }; then
  echo "doctor-rails: FAILED: the healthy pair (exit $hrc)"; rc=1
fi
if ! grep -q 'rail 1 rxe1 -> rxe1: up' /tmp/doctor-ok.out; then
  echo "doctor-rails: FAILED: the healthy pair does not run over both rails"; rc=1
fi
echo "--- doctor-rails: rxe1's link (dummy1) taken down while the probe runs"
# shellcheck disable=SC2086
$hixl doctor --peer "$peer" --expect verbs $opt $probe >/tmp/doctor-down.out 2>/tmp/doctor-down.err &
d=$!
until_in /tmp/doctor-down.err probing || echo "doctor-rails: the probe did not start"
ip link set dummy1 down
wait $d
drc=$?
ip link set dummy1 up
cat /tmp/doctor-down.out
if [ $drc != 3 ] || ! grep -q '\[rail-down\]' /tmp/doctor-down.out; then
  echo "doctor-rails: FAILED: expected [rail-down] and exit 3, got exit $drc"; cat /tmp/doctor-down.err; rc=1
fi
kill -TERM $ds
wait $ds || { echo "doctor-rails: FAILED: doctor --serve did not stop cleanly on SIGTERM"; rc=1; }
[ $rc = 0 ] && echo "doctor-rails: ok"
exit $rc
