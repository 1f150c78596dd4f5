#!/usr/bin/env bash
# What the tests need beyond a Rust toolchain, from this one list (the README's test command,
# tools/test.sh, and .ci/run call it):
#
#   tools/setup.sh            # as root on Debian or Ubuntu: apt-get installs what is missing;
#                             # otherwise checks, and names in one line what to install
#   tools/setup.sh --check    # only checks (exit 1 and the line, if anything is missing)
#   tools/setup.sh --list     # prints the packages, one line
#
# Groups: the wheel's build (rdma-sys generates its bindings over libibverbs' headers with
# bindgen, so libclang), the tests (a venv for the wheel's tests, etcd for the directory's,
# iproute2 and nftables for the network namespaces and the faults they inject), and the
# Soft-RoCE guest (qemu and what goes into its initramfs; tools/softroce-vm.sh).
# protoc is not on the list: the build uses the one protoc-bin-vendored ships (tools/protoc).
set -euo pipefail

BUILD="pkg-config libibverbs-dev librdmacm-dev libclang-dev"
TESTS="python3 python3-venv etcd-server etcd-client iproute2 nftables"
GUEST="qemu-system-x86 busybox-static ibverbs-providers ibverbs-utils kmod cpio gzip"
ALL="$BUILD $TESTS $GUEST"

missing() {
  local p out=()
  for p in $ALL; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || out+=("$p")
  done
  echo "${out[*]:-}"
}

mode=${1:-install}
case $mode in
  --list) echo "$ALL"; exit 0 ;;
  --check | install) ;;
  *) sed -n '2,14p' "$0"; exit 2 ;;
esac

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "setup: not a Debian-like system (no dpkg-query); the tests need the equivalents of: $ALL" >&2
  exit 1
fi
need=$(missing)
[ -z "$need" ] && exit 0
if [ "$mode" = install ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing $need"
  apt-get update -qq
  # shellcheck disable=SC2086 # the list is words
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null
  need=$(missing)
  [ -z "$need" ] && exit 0
fi
echo "setup: the tests need these packages; as root: apt-get install --no-install-recommends $need" >&2
exit 1
