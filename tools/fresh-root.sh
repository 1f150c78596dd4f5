#!/usr/bin/env bash
# Proves the README's two commands on a bare machine: debootstraps a minimal Debian (bookworm,
# minbase) into a fresh root, bind-mounts this machine's Rust toolchain (rustup's ~/.rustup and
# ~/.cargo/bin, read-only) into it with an empty CARGO_HOME, copies this checkout's committed
# tree (git archive HEAD) there, and runs, as root inside it:
#   1. the main job:     cargo run --release -p hixl-cli -- demo
#      with nothing installed but what rustup's toolchain itself needs to link (gcc, libc6-dev)
#      and ca-certificates to fetch crates: no protoc, clang or -dev package;
#   2. the wheel from source, `pip install ./crates/hixl-py`, with only Rust and Python
#      (python3-venv) installed, and the installed package imported and an engine made;
#   3. the test command: tools/test.sh (which installs what the tests need, then runs them).
#
#   tools/fresh-root.sh            # all three (as root; needs debootstrap, which it apt-gets)
#   tools/fresh-root.sh demo       # only the first
#   tools/fresh-root.sh pip        # only the second
#   REUSE=1 tools/fresh-root.sh    # again in the root a previous run left (its packages, crates
#                                  # and target/ kept; the tree copied anew)
#
# Environment: ROOT (default /tmp/hixl-fresh-root; made anew), MIRROR (http://deb.debian.org/debian),
# SUITE (bookworm). Prints a table of the steps and their seconds; exits with the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "fresh-root: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }
ROOT=${ROOT:-/tmp/hixl-fresh-root}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SUITE=${SUITE:-bookworm}
what=${1:-all}
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
cargo_bin=${CARGO_HOME:-$HOME/.cargo}/bin
[ -d "$rustup_home/toolchains" ] || { echo "fresh-root: no rustup toolchain at $rustup_home" >&2; exit 2; }

NAMES=() TIMES=()
timed() {
  local name=$1 t0=$SECONDS
  shift
  printf '\n=== %s\n' "$name"
  "$@"
  NAMES+=("$name") TIMES+=("$((SECONDS - t0))")
}
mounted=()
cleanup() {
  local rc=$? i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
  printf '\n=== fresh root (exit %s)\n' "$rc"
  for ((i = 0; i < ${#NAMES[@]}; i++)); do printf '%6ss  %s\n' "${TIMES[i]}" "${NAMES[i]}"; done
}
trap cleanup EXIT
bind() { # bind SRC DEST [ro]
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mounted+=("$2")
  [ "${3:-}" = ro ] && mount -o remount,bind,ro "$2"
  return 0
}

bootstrap() {
  command -v debootstrap >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  }
  # Never remove a root that still has something mounted in it (a run killed before its
  # cleanup): /dev and /sys are bound in there.
  if grep -qE " $ROOT[/ ]" /proc/mounts; then
    echo "fresh-root: $ROOT still has mounts (a run was killed?); unmount them first" >&2
    return 1
  fi
  rm -rf "$ROOT"
  debootstrap --variant=minbase "$SUITE" "$ROOT" "$MIRROR" >/dev/null
  echo "deb $MIRROR $SUITE main" >"$ROOT/etc/apt/sources.list"
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
  # What an installed machine has and debootstrap leaves out.
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$ROOT/etc/hosts"
}

mounts() {
  # The root a mount point of its own, as / is on a machine (`ip netns` makes / a slave mount).
  mount --bind "$ROOT" "$ROOT" && mounted+=("$ROOT")
  mount -t proc proc "$ROOT/proc" && mounted+=("$ROOT/proc")
  bind /sys "$ROOT/sys"
  bind /dev "$ROOT/dev"
  bind /dev/pts "$ROOT/dev/pts"
  mount -t tmpfs tmpfs "$ROOT/run" && mounted+=("$ROOT/run")
  mount -t tmpfs -o size=8g tmpfs "$ROOT/dev/shm" && mounted+=("$ROOT/dev/shm")
  bind "$rustup_home" "$ROOT/root/.rustup" ro
  bind "$cargo_bin" "$ROOT/opt/cargo-bin" ro
  mkdir -p "$ROOT/src/hixl"
  git archive HEAD | tar -x -C "$ROOT/src/hixl"
  grep -q localhost "$ROOT/etc/hosts" 2>/dev/null ||
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$ROOT/etc/hosts"
}

inside() {
  chroot "$ROOT" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/opt/cargo-bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    RUSTUP_HOME=/root/.rustup CARGO_HOME=/root/.cargo CARGO_TERM_COLOR=never \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    HIXL_REQUIRE_NETNS=1 HIXL_REQUIRE_URING=1 HIXL_REQUIRE_ETCD=1 \
    /bin/bash -c "cd /src/hixl && $1"
}

linker() {
  # What rustup's toolchain needs on any Linux to link (it ships no linker), and certificates
  # to fetch crates.
  inside "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends gcc libc6-dev ca-certificates >/dev/null"
  # The machine's own local CAs (a proxy's, where the network goes through one), so that the
  # root reaches crates.io and PyPI as the machine does.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$ROOT/usr/local/share/ca-certificates/"
    inside "update-ca-certificates >/dev/null"
  fi
}

# Nothing but the toolchain's linker: no protoc, clang, libclang or RDMA headers.
bare() {
  inside "! command -v protoc && ! command -v clang && ! ls /usr/include/infiniband \
    && ! ls /usr/lib/llvm-*/lib/libclang*" >/dev/null 2>&1 ||
    { echo "fresh-root: the root is not bare (protoc, clang, libclang or RDMA headers found)" >&2; return 1; }
}

if [ "${REUSE:-0}" = 1 ] && [ -d "$ROOT/src/hixl" ]; then
  timed "mounts, toolchain and tree (reusing $ROOT)" mounts
else
  timed "debootstrap $SUITE (minbase)" bootstrap
  timed "mounts, toolchain and tree" mounts
  timed "gcc, libc6-dev, ca-certificates (the toolchain's linker)" linker
fi
source_wheel() {
  # What a previous test command installed goes first: only Rust and Python stay.
  inside "DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq libibverbs-dev librdmacm-dev \
    'libclang*-dev' protobuf-compiler >/dev/null 2>&1; apt-get autoremove -y -qq >/dev/null 2>&1;
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 \
    python3-venv >/dev/null"
  bare
  inside "rm -rf /tmp/srcv && python3 -m venv /tmp/srcv && /tmp/srcv/bin/pip install -q ./crates/hixl-py \
    && cd /tmp && /tmp/srcv/bin/python -c 'import hixl; e = hixl.Engine(\"127.0.0.1\"); \
    print(\"hixl\", hixl.__version__, \"from source:\", e.local_engine, e.info()[\"verbs_reason\"]); e.close()'"
}

if [ "$what" = all ] || [ "$what" = demo ]; then
  bare
  timed "main job: cargo run --release -p hixl-cli -- demo" inside "cargo run --release -p hixl-cli -- demo"
fi
if [ "$what" = all ] || [ "$what" = pip ]; then
  timed "pip install ./crates/hixl-py with only Rust and Python" source_wheel
fi
[ "$what" = all ] || exit 0
timed "test command: tools/test.sh" inside "tools/test.sh"
