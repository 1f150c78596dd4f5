#!/usr/bin/env bash
# Prints the path of the hixl wheel to install into a framework's venv: $HIXL_WHEEL, else the
# newest one tools/python-tests.sh built, else one built here with maturin (its output goes to
# stderr). Used by tools/vllm-e2e.sh and tools/sglang-e2e.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
wheel=${HIXL_WHEEL:-}
if [ -z "$wheel" ]; then
  wheel=$(ls -t "$root"/target/python/wheels/hixl-*.whl 2>/dev/null | head -1 || true)
fi
if [ -z "$wheel" ]; then
  work=$root/target/python
  if [ ! -x "$work/build-venv/bin/maturin" ]; then
    "${PYTHON:-python3}" -m venv "$work/build-venv" >&2
    "$work/build-venv/bin/pip" install -q 'maturin>=1.7,<2' >&2
  fi
  "$work/build-venv/bin/maturin" build --release --features verbs -m crates/hixl-py/Cargo.toml --out "$work/wheels" >&2
  wheel=$(ls -t "$work"/wheels/hixl-*.whl | head -1)
fi
echo "$wheel"
