#!/usr/bin/env bash
# The Python wheel end to end: builds `hixl` with maturin (release), installs the wheel into a
# fresh venv (no Rust toolchain on PATH), and runs the Python tests there (pytest; real
# processes over real sockets and the fabric). Extra arguments go to pytest. With HIXL_WHEEL
# naming a wheel (tools/release.sh's manylinux one), it builds nothing and tests that wheel.
#
# Needs python3 >= 3.9 with venv (Debian: python3-venv), libibverbs-dev librdmacm-dev
# libclang-dev (the wheel carries the verbs transport) and network access to PyPI for maturin,
# numpy and pytest. tools/guest-python.sh then runs a Python pair over verbs with this venv.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=${PYTHON:-python3}
work=$root/target/python
venv=$work/test-venv
if [ -n "${HIXL_WHEEL:-}" ]; then
  # A wheel built elsewhere (tools/release.sh): test it as it is, build nothing, in a venv of
  # its own (test-venv stays the one tools/guest-python.sh uses).
  venv=$work/wheel-test-venv
  [ -f "$HIXL_WHEEL" ] || { echo "python-tests: HIXL_WHEEL=$HIXL_WHEEL is not a file" >&2; exit 1; }
  wheel=$(cd "$(dirname "$HIXL_WHEEL")" && pwd)/$(basename "$HIXL_WHEEL")
else
  rm -rf "$work/wheels"
  if [ ! -x "$work/build-venv/bin/maturin" ]; then
    "$PY" -m venv "$work/build-venv"
    "$work/build-venv/bin/pip" install -q 'maturin>=1.7,<2'
  fi
  "$work/build-venv/bin/maturin" build --release --features verbs -m crates/hixl-py/Cargo.toml --out "$work/wheels"
  wheel=$(ls "$work"/wheels/hixl-*.whl)
fi
rm -rf "$venv"
"$PY" -m venv "$venv"
# Installing and testing see no cargo or rustc: the wheel needs no toolchain.
clean_path=/usr/local/bin:/usr/bin:/bin
env PATH="$clean_path" "$venv/bin/pip" install -q "$wheel" numpy pytest mypy
cd crates/hixl-py/tests
# The installed package's type stubs and annotations hold together (what editors complete from).
(cd "$work" && env PATH="$clean_path" "$venv/bin/python" -m mypy --strict --no-incremental -p hixl)
env PATH="$clean_path" "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
