#!/usr/bin/env bash
# hixl as SGLang's PD-disaggregation transfer backend (hixl.sglang, SGLang 0.5.23), inside
# SGLang's own code: the plugin as SGLang loads it (crates/hixl-py/tests/sglang/check_plugin.py),
# then bench/sglang/pd_harness.py: SGLang's bootstrap server, prefill and decode scheduler
# ranks as processes with SGLang's token-to-KV pools on CPU tensors and its KV managers,
# senders and receivers, every page checked byte for byte; equal TP, differing attention-TP
# both ways, MLA, a hybrid model's SWA state, a killed prefill server, a killed decode (the
# prefill's requests fail naming hixl's cause), decode aborts; as root, the plain run and the
# killed prefill with the prefill server and the decode in different hosts of tools/hosts.sh's
# rig (bench/sglang/_hosts.py: each engine advertises its host's address, links run over tcp;
# without root they run on one host over tcp); and with
# HIXL_SGLANG_MOONCAKE=1, SGLang's own Mooncake backend (mooncake_tcp) through the same harness.
#
#   tools/sglang-e2e.sh
#
# Environment:
#   SGLANG_VENV   the SGLang venv (default ~/.cache/hixl-sglang/venv; made by
#                 bench/sglang/setup.sh if missing, ~2.5 min and ~6 GB from PyPI)
#   HIXL_WHEEL    the hixl wheel to install into it (default: the newest one
#                 tools/python-tests.sh built, else built here with maturin)
# Exit status 0 only if every run passed every check.
set -euo pipefail
cd "$(dirname "$0")/.."
export SGLANG_VENV=${SGLANG_VENV:-$HOME/.cache/hixl-sglang/venv}

# The install steps check what is there; the setup's own import check is skipped (the runs
# below import the same modules and say what is missing).
SGLANG_SETUP_CHECK=0 bench/sglang/setup.sh

wheel=$(tools/hixl-wheel.sh)
echo "== hixl wheel: $(basename "$wheel")"
"$SGLANG_VENV/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"
py=$SGLANG_VENV/bin/python
export PYTHONWARNINGS=ignore

echo "== the plugin as SGLang loads it: entry point, --disaggregation-transfer-backend hixl, classes"
"$py" crates/hixl-py/tests/sglang/check_plugin.py

rc=0
run() {
  echo "== pd_harness.py $*"
  "$py" bench/sglang/pd_harness.py --timeout 150 "$@" || rc=1
}
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then
  # prefill server (bootstrap and ranks) in host h1, decode in h2: these cover the same-host
  # runs over tcp below, which run in their place where there are no network namespaces
  hosts=(--hosts)
  tcp=()  # auto: across hosts it must choose tcp (checked)
else
  hosts=()
  tcp=(--transport tcp)
fi
export HIXL_HOSTS_PREFIX=${HIXL_HOSTS_PREFIX:-hxsg}
run --backend hixl "${hosts[@]}" "${tcp[@]}" --requests 64 --tokens 512
# a hybrid model's SWA state (layers 1 and 3 over a 256-token window, SGLang's SWAKVPool)
run --backend hixl --transport fabric --model tiny-swa --prefill-tp 2 --decode-tp 1 --requests 32
run --backend hixl --transport tcp --prefill-tp 1 --decode-tp 2 --requests 32
run --backend hixl --transport fabric --model tiny-mla --prefill-tp 1 --decode-tp 2 --requests 32
run --backend hixl "${hosts[@]}" --transport tcp --fault kill-prefill --requests 32
run --backend hixl --transport fabric --fault decode-abort --requests 32
# a real model's KV, so that writes are in flight when the decode dies
run --backend hixl --transport tcp --fault kill-decode --model llama-3.1-8b --requests 16 \
  --tokens 1024 --pool-tokens 12288
if [ "${HIXL_SGLANG_MOONCAKE:-0}" = 1 ]; then
  run --backend mooncake_tcp --requests 32  # SGLang's own backend, same harness
fi
exit $rc
