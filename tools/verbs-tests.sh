#!/usr/bin/env bash
# Builds the verbs test binaries (hixl-verbs, and the engine's tests/verbs/) and the hixl
# command with the verbs feature on the host, and runs them inside the Soft-RoCE guest of
# tools/softroce-vm.sh with HIXL_VERBS_DEVICE=rxe0 (on the host, without it, the tests skip),
# followed by `hixl info`, `hixl bench comm --transport verbs`, and `hixl doctor` over two rails
# (tools/doctor-rails-guest.sh).
#
#   tools/verbs-tests.sh                 # build, boot, run every hixl-verbs test binary
#   tools/verbs-tests.sh -- --skip kill  # extra arguments go to each test binary
#
# Needs: libibverbs-dev librdmacm-dev libclang-dev (to build) and `tools/softroce-vm.sh deps`.
# Exits non-zero if any test fails in the guest, or the guest does not come up.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${1:-}" = "--" ] && shift
t0=$SECONDS
# The test binaries: every target of hixl-verbs (unit tests, each tests/*.rs), and the
# engine's verbs tests (hixl-async built with the `verbs` feature).
exes() { grep -o '"executable":"[^"]*"' | sed 's/"executable":"\(.*\)"/\1/'; }
bins=$( {
  cargo test -p hixl-verbs --no-run --message-format=json | exes
  cargo test -p hixl-async --features verbs --test verbs --no-run --message-format=json | exes
  cargo test -p hixl-datadist --features hixl-async/verbs --test lease_race --no-run --message-format=json | exes
} | sort -u)
[ -n "$bins" ] || { echo "verbs-tests: no test binaries built" >&2; exit 1; }
# The hixl command with the verbs transport, for `hixl info` and `hixl bench comm` in the guest.
cli=$(cargo build -p hixl-cli --features verbs --message-format=json | exes | grep '/hixl$' | head -n 1)
[ -n "$cli" ] || { echo "verbs-tests: the hixl command did not build" >&2; exit 1; }
echo "verbs-tests: built in $((SECONDS - t0))s:" $bins "$cli"
tools/softroce-vm.sh build $bins "$cli" tools/doctor-rails-guest.sh
# Each binary runs with two test threads (the guest has two vCPUs); a failing binary does not
# stop the others, the status is the first failure's.
args="--test-threads=2 $*"
cmd="export HIXL_VERBS_DEVICE=rxe0 RUST_BACKTRACE=1; rc=0"
for b in $bins; do
  n=$(basename "$b")
  # hixl-verbs' MTU test reads between rxe2 (MTU 1024) and rxe3 (4096), the ends of a veth pair.
  case $n in mtu-*) pre="HIXL_VERBS_MTU_PAIR=rxe2,rxe3 " ;; *) pre="" ;; esac
  # the lease race over verbs only (its tcp and fabric sweep runs on the host)
  case $n in lease_race-*) only="a_pull_never_lands_bytes_of_a_reused_lease_verbs --exact --nocapture " ;; *) only="" ;; esac
  cmd="$cmd; echo '=== $n'; $pre/extra/$n $only$args || rc=\$?"
  # The engine's rail tests take rxe0's and rxe1's links down and up: alone, one at a time.
  # The MTU test among them uses rxe2 (MTU 1024) and rxe3 (4096), the ends of a veth pair.
  case $n in verbs-*)
    cmd="$cmd; echo '=== $n (rails over rxe0,rxe1; MTUs over rxe2,rxe3)'"
    cmd="$cmd; HIXL_VERBS_RAILS=rxe0,rxe1 HIXL_VERBS_MTU_PAIR=rxe2,rxe3 /extra/$n rails_ --test-threads=1 $* || rc=\$?" ;;
  esac
done
# The command over real verbs: what it sees, then a short benchmark (in a TCG guest these
# figures measure correctness, not speed; `hixl bench` fails if any transfer fails).
cmd="$cmd; echo '=== hixl info'; /extra/hixl info || rc=\$?"
cmd="$cmd; echo '=== hixl bench comm --transport verbs'"
cmd="$cmd; /extra/hixl bench comm --transport verbs --op both --blocks 16K,128K,2M --total 8M --duration 0.5 || rc=\$?"
# hixl doctor over two rails: healthy, then a rail's link down mid-probe named rail-down.
cmd="$cmd; echo '=== hixl doctor over two rails (tools/doctor-rails-guest.sh)'"
cmd="$cmd; sh /extra/doctor-rails-guest.sh || rc=\$?"
cmd="$cmd; exit \$rc"
tools/softroce-vm.sh run "$cmd"
echo "verbs-tests: total ${SECONDS}s"
