#!/usr/bin/env bash
# Builds and checks every release artifact of hixl into one folder (target/release-artifacts,
# or $HIXL_RELEASE_OUT):
#
#   hixl-VERSION-cp39-abi3-manylinux_2_28_ARCH.whl   the Python wheel (any CPython >= 3.9), built
#                           with zig against glibc 2.28 whatever this host's glibc; auditwheel
#                           checks that it needs no library but glibc's (libibverbs is loaded
#                           at run time); then installed with pip into a fresh venv with no cargo
#                           or rustc on PATH, where the Python tests run (tools/python-tests.sh)
#   hixl-VERSION.tar.gz     the sdist; built with pip in a fresh venv with no protoc, as is
#                           `pip install ./crates/hixl-py`
#   hixl-VERSION-TRIPLE.tar.gz (+ .sha256)   the `hixl` CLI (glibc >= 2.28), README and LICENSE
#   crates                  every publishable crate through `cargo publish --workspace --dry-run`
#
#   tools/release.sh                  everything (about 30 min on 2 cores from a cold cache)
#   tools/release.sh wheel cli        only those steps: wheel, sdist, cli, crates
#
# Needs: rustup's stable toolchain, python3 with venv and pip (Debian: python3-venv), network
# access to PyPI (maturin, ziglang, auditwheel, cargo-zigbuild into target/release-tools; the
# test venvs' numpy and pytest) and to crates.io, and what the verbs transport builds against:
# pkg-config libibverbs-dev librdmacm-dev libclang-dev (tools/setup.sh installs them). No
# protoc: the build uses the one protoc-bin-vendored ships (tools/protoc).
#
# Environment: HIXL_RELEASE_OUT (the output folder), HIXL_RELEASE_TARGET (CARGO_TARGET_DIR of
# the release builds, target/release-build: apart from target/ so that they do not wait on
# debug builds' locks), PYTHON (python3), HIXL_RELEASE_ALLOW_DIRTY=1 (publish dry-run of a
# work tree with uncommitted changes), HIXL_RELEASE_SKIP_TESTS=1 (build and audit the wheel
# without running the Python tests).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${HIXL_RELEASE_OUT:-$root/target/release-artifacts}
build=${HIXL_RELEASE_TARGET:-$root/target/release-build}
tools=$root/target/release-tools
PY=${PYTHON:-python3}
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(wheel sdist cli crates)
for s in "${steps[@]}"; do
  case $s in
    wheel | sdist | cli | crates) ;;
    *) echo "release: unknown step '$s' (steps: wheel sdist cli crates)" >&2; exit 2 ;;
  esac
done
want() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
die() { echo "release: $*" >&2; exit 1; }
say() { printf '\n=== release: %s (%ss)\n' "$*" "$SECONDS"; }

# --- What this machine must have, named in one line.
missing=()
command -v cargo >/dev/null 2>&1 || missing+=("cargo (rustup's stable toolchain)")
command -v rustc >/dev/null 2>&1 || missing+=("rustc (rustup's stable toolchain)")
if ! command -v "$PY" >/dev/null 2>&1; then
  missing+=("$PY (python3 >= 3.9)")
elif ! "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=("python3-venv (the venv module with pip)")
fi
if want wheel || want sdist || want cli; then
  if ! command -v pkg-config >/dev/null 2>&1; then
    missing+=("pkg-config")
  else
    pkg-config --exists libibverbs 2>/dev/null || missing+=("libibverbs-dev")
    pkg-config --exists librdmacm 2>/dev/null || missing+=("librdmacm-dev")
  fi
  found=
  for f in /usr/lib/llvm-*/lib/libclang*.so* /usr/lib/*/libclang*.so* /usr/lib64/libclang*.so*; do
    [ -e "$f" ] && found=$f
  done
  [ -n "$found" ] || [ -n "${LIBCLANG_PATH:-}" ] || missing+=("libclang-dev (or LIBCLANG_PATH)")
fi
if [ ${#missing[@]} -gt 0 ]; then
  die "missing: ${missing[*]} (Debian: tools/setup.sh installs the packages)"
fi

cargo_bin=$(dirname "$(command -v cargo)")
rustc_bin=$(dirname "$(command -v rustc)")
triple=$(rustc -vV | sed -n 's/^host: //p')
arch=${triple%%-*}
version=$(cargo metadata --no-deps --format-version 1 --manifest-path "$root/Cargo.toml" |
  "$PY" -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "hixl-py"))')
mkdir -p "$out" "$build" "$tools"
export CARGO_TARGET_DIR=$build
# A PATH without the Rust toolchain (installing and running a wheel need none) and one with only
# it added (building from source); neither has this session's other tools.
plain_path=/usr/local/bin:/usr/bin:/bin
rust_path=$cargo_bin:$rustc_bin:$plain_path
if env PATH="$plain_path" sh -c 'command -v cargo || command -v rustc' >/dev/null 2>&1; then
  die "cargo or rustc is in $plain_path: the 'no Rust toolchain' checks would prove nothing"
fi

# rdma-sys (the verbs transport) runs bindgen over the system's libibverbs headers. Under zig,
# cargo-zigbuild hands bindgen zig's own C headers with -nostdinc, which lose the two directories
# the system's headers need: clang's builtin headers (stddef.h) and the multiarch directory
# (bits/). Give them back, ahead of zig's; the bindings come out as a native build's.
if [ -z "${BINDGEN_EXTRA_CLANG_ARGS:-}" ]; then
  bindgen_args=()
  for d in ${LIBCLANG_PATH:+"$LIBCLANG_PATH"/clang/*/include} /usr/lib/llvm-*/lib/clang/*/include \
    /usr/lib64/clang/*/include /usr/lib/clang/*/include; do
    [ -f "$d/stddef.h" ] && builtin=$d
  done
  [ -n "${builtin:-}" ] && bindgen_args+=(-isystem "$builtin")
  multiarch=$(gcc -print-multiarch 2>/dev/null || true)
  [ -n "$multiarch" ] && [ -d "/usr/include/$multiarch" ] && bindgen_args+=(-isystem "/usr/include/$multiarch")
  export BINDGEN_EXTRA_CLANG_ARGS="${bindgen_args[*]}"
fi

# --- Build tools, in a venv of their own (kept between runs).
venv_tools() {
  if [ ! -x "$tools/venv/bin/cargo-zigbuild" ]; then
    say "build tools into $tools/venv"
    rm -rf "$tools/venv"
    "$PY" -m venv "$tools/venv"
    # Versions this script was last run with: maturin 1.16, ziglang 0.17.1, auditwheel 6.8,
    # cargo-zigbuild 0.24 (zig is pinned: its linker's flags change between releases).
    "$tools/venv/bin/pip" install -q 'maturin>=1.9,<2' 'ziglang==0.17.1' 'auditwheel>=6.4' \
      'cargo-zigbuild>=0.20'
  fi
  export PATH=$tools/venv/bin:$PATH
}

# The NEEDED entries of an ELF file, one a line.
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
# Fails unless every NEEDED entry is glibc's (or libgcc_s, which manylinux allows) and none is
# libibverbs or librdmacm, and no symbol needs a glibc newer than 2.28.
check_elf() {
  local f=$1 what=$2 lib newest
  for lib in $(needed "$f"); do
    case $lib in
      libc.so.6 | libm.so.6 | libpthread.so.0 | libdl.so.2 | librt.so.1 | libutil.so.1 | \
        ld-linux-*.so.* | libgcc_s.so.1) ;;
      *) die "$what needs $lib: only glibc's libraries are allowed (libibverbs is dlopened)" ;;
    esac
  done
  newest=$(readelf --dyn-syms -W "$f" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' |
    sort -t. -k1,1n -k2,2n -k3,3n -u | tail -1)
  "$PY" -c "import sys; v=tuple(map(int,'$newest'.split('.'))); sys.exit(v > (2, 28))" ||
    die "$what needs GLIBC_$newest, newer than manylinux_2_28's 2.28"
  echo "$what: NEEDED $(needed "$f" | tr '\n' ' '); newest glibc symbol version GLIBC_$newest"
}

# --- The wheel: manylinux_2_28 through zig, auditwheel, then the Python tests against it.
if want wheel; then
  venv_tools
  say "wheel (maturin --zig, manylinux_2_28)"
  rm -f "$out"/hixl-*.whl
  maturin build --release --locked --strip --zig --compatibility manylinux_2_28 --features verbs \
    --auditwheel check -m crates/hixl-py/Cargo.toml --out "$out"
  wheel=$(ls "$out"/hixl-"$version"-*manylinux_2_28*.whl 2>/dev/null | head -1)
  [ -n "$wheel" ] || die "maturin left no manylinux_2_28 wheel in $out"
  say "auditwheel show $(basename "$wheel")"
  auditwheel show "$wheel" | tee "$tools/auditwheel.txt"
  grep -q 'manylinux_2_28' "$tools/auditwheel.txt" ||
    die "auditwheel does not find $(basename "$wheel") consistent with manylinux_2_28"
  if grep -q 'following external shared libraries are required' "$tools/auditwheel.txt"; then
    die "auditwheel finds external libraries that the wheel would need to vendor"
  fi
  rm -rf "$tools/unpacked" && mkdir -p "$tools/unpacked"
  "$PY" -m zipfile -e "$wheel" "$tools/unpacked"
  so=$(ls "$tools"/unpacked/hixl/_hixl*.so)
  check_elf "$so" "$(basename "$wheel") _hixl.so"
  grep -q 'libibverbs.so.1' "$so" || die "_hixl.so does not name libibverbs.so.1 (its dlopen)"
  if [ "${HIXL_RELEASE_SKIP_TESTS:-0}" = 1 ]; then
    echo "release: HIXL_RELEASE_SKIP_TESTS=1: the wheel's Python tests are not run" >&2
  else
    say "Python tests against $(basename "$wheel"), installed with pip and no Rust on PATH"
    HIXL_WHEEL=$wheel tools/python-tests.sh
  fi
fi

# --- The sdist, and two builds from source with pip: the sdist, and ./crates/hixl-py.
if want sdist; then
  venv_tools
  say "sdist (maturin sdist)"
  rm -f "$out"/hixl-*.tar.gz.part "$out/hixl-$version.tar.gz"
  rm -rf "$tools/sdist" && mkdir -p "$tools/sdist"
  maturin sdist -m crates/hixl-py/Cargo.toml --out "$tools/sdist"
  # maturin packs the workspace the wheel needs, not the cargo configuration that points PROTOC
  # at tools/protoc (its includes cannot name files above crates/hixl-py): add both, and the
  # LICENSE, at the sdist's root, which is the workspace's root.
  "$PY" - "$tools/sdist/hixl-$version.tar.gz" "$out/hixl-$version.tar.gz" "hixl-$version" <<'EOF'
import sys, tarfile
src, dst, top = sys.argv[1:]
extra = {".cargo/config.toml": 0o644, "tools/protoc": 0o755, "LICENSE": 0o644}
with tarfile.open(src) as tin, tarfile.open(dst, "w:gz", format=tarfile.PAX_FORMAT) as tout:
    names = set()
    for m in tin.getmembers():
        names.add(m.name)
        tout.addfile(m, tin.extractfile(m) if m.isfile() else None)
    for path, mode in extra.items():
        if f"{top}/{path}" in names:
            continue
        info = tout.gettarinfo(path, arcname=f"{top}/{path}")
        info.mode, info.uid, info.gid, info.uname, info.gname = mode, 0, 0, "", ""
        with open(path, "rb") as f:
            tout.addfile(info, f)
EOF
  sdist=$out/hixl-$version.tar.gz
  # Builds from source see the Rust toolchain and the system, no protoc, no PROTOC.
  if env PATH="$rust_path" sh -c 'command -v protoc' >/dev/null 2>&1; then
    echo "release: note: this machine has a protoc on PATH, so these builds do not prove that none is needed" >&2
  fi
  from_source() { # $1: label, $2: what pip installs
    local venv=$tools/src-venv-$1
    rm -rf "$venv"
    "$PY" -m venv "$venv"
    say "pip install $2 (build from source: Rust and Python only, no protoc)"
    local t0=$SECONDS
    env -u PROTOC PATH="$rust_path" CARGO_TARGET_DIR="$build/from-source" \
      "$venv/bin/pip" install -q --no-cache-dir "$2"
    env PATH="$plain_path" "$venv/bin/python" -c \
      'import hixl, sys; print("imported hixl", hixl.__version__, "from", hixl.__file__)'
    echo "release: pip install $2 built in $((SECONDS - t0)) s"
  }
  from_source sdist "$sdist"
  from_source tree ./crates/hixl-py
fi

# --- The CLI: cargo zigbuild for glibc 2.28, with the verbs transport (dlopened), as a tarball.
if want cli; then
  venv_tools
  say "hixl CLI (cargo zigbuild --target $triple.2.28, features verbs)"
  cargo zigbuild --release --locked -p hixl-cli --features verbs --target "$triple.2.28"
  bin=$build/$triple/release/hixl
  [ -x "$bin" ] || die "cargo zigbuild left no $bin"
  check_elf "$bin" "hixl"
  name=hixl-$version-$triple
  stage=$tools/$name
  rm -rf "$stage" && mkdir -p "$stage"
  # The release profile keeps line tables of the workspace's code for profilers; the shipped
  # binary does without.
  objcopy --strip-debug "$bin" "$stage/hixl"
  cp README.md LICENSE "$stage/"
  "$stage/hixl" --version
  tar -C "$tools" --owner=0 --group=0 --numeric-owner -czf "$out/$name.tar.gz" "$name"
  (cd "$out" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256" && sha256sum -c "$name.tar.gz.sha256")
fi

# --- The crates: cargo packs each publishable crate and builds it from its package, in
# dependency order, against the others' packages (crates that must not be published say
# publish = false).
if want crates; then
  say "cargo publish --workspace --dry-run"
  dirty=()
  [ "${HIXL_RELEASE_ALLOW_DIRTY:-0}" = 1 ] && dirty=(--allow-dirty)
  cargo publish --workspace --dry-run --locked "${dirty[@]}"
fi

say "done in ${SECONDS}s: $out"
ls -l "$out"
