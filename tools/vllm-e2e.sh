#!/usr/bin/env bash
# vLLM prefill/decode disaggregation end to end with hixl's connector (hixl.vllm:HixlConnector):
# a prefill and a decode vLLM process (vLLM 0.32's CPU build, a tiny random-weight Llama made
# locally), every decode output compared token for token with a single-instance run, vLLM's
# own accounting that the decode computed none of the prompt, bytes moved = blocks x block
# size, and no lease expiry or transfer failure in any log (bench/vllm/README.md).
#
# Then the same over HTTP (bench/vllm/serve_e2e.py: vLLM's OpenAI servers behind
# python -m hixl.vllm.proxy): across hosts of tools/hosts.sh's rig over tcp
# (bench/vllm/hosts_e2e.py; as root, else on one host), and with a prefill of TP 2.
#
#   tools/vllm-e2e.sh [pd_e2e.py options...]          the offline runs over the fabric, then HTTP
#   RUNS=3 HIXL_VLLM_TRANSPORTS=auto tools/vllm-e2e.sh  three runs, the transport auto picks
#
# Environment:
#   VLLM_VENV             the vLLM venv (default ~/.cache/hixl-vllm/venv; made by
#                         bench/vllm/setup.sh if missing, ~2.5 min and ~6 GB from PyPI)
#   VLLM_TINY_MODEL       the model folder (default ~/.cache/hixl-vllm/tiny-llama)
#   HIXL_WHEEL            the hixl wheel to install into it (default: the one
#                         tools/python-tests.sh built, else built here with maturin)
#   HIXL_VLLM_TRANSPORTS  the transports to run, forced through kv_connector_extra_config
#                         (default "fabric"; the HTTP runs below cover tcp)
#   RUNS                  runs per transport (default 1)
#   HIXL_VLLM_FAULTS      1 (default): then the fault runs (bench/vllm/README.md); 0: skip
# Exit status 0 only if every run passed every check.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export VLLM_VENV=${VLLM_VENV:-$HOME/.cache/hixl-vllm/venv}
export VLLM_TINY_MODEL=${VLLM_TINY_MODEL:-$HOME/.cache/hixl-vllm/tiny-llama}
export PD_E2E_RESULTS=${PD_E2E_RESULTS:-$root/target/vllm-e2e}

bench/vllm/setup.sh

wheel=$(tools/hixl-wheel.sh)
echo "== hixl wheel: $(basename "$wheel")"
"$VLLM_VENV/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"

echo "== hixl.vllm against vLLM's own classes (stats, Prometheus metrics, configuration)"
"$VLLM_VENV/bin/python" crates/hixl-py/tests/vllm/check_connector.py
echo "== hixl.vllm's halves driven with vLLM's KV cache classes: TP pairs, block sizes, PP stages, groups, MLA, layouts, refusals"
"$VLLM_VENV/bin/python" crates/hixl-py/tests/vllm/check_worker.py

# The reference outputs (a single instance's tokens for the same prompts) are computed once
# per invocation and reused by every run that has the same prompts and engine settings.
refs=$(mktemp -d)
trap 'rm -rf "$refs"' EXIT
# vLLM 0.32's CPU attention takes its AMX kernel for bfloat16 where the CPU has AMX, and that
# kernel dies with SIGILL when an instance's first attention call is a decode step, as a P/D
# decode instance's is (seen on Intel Xeon with AMX: the aggregated and the prefill instance,
# which prefill first, are not hit). There every run uses float32 (vLLM's vector kernel).
dtype=()
if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
  dtype=(--dtype float32)
  echo "== this CPU has AMX: the model runs in float32 (vLLM's AMX bfloat16 attention crashes a decode instance)"
fi
set -- --reference-cache "$refs" "${dtype[@]}" "$@"
rc=0
for t in ${HIXL_VLLM_TRANSPORTS:-fabric}; do
  echo "== hixl.vllm over $t"
  RUNS=${RUNS:-1} bench/vllm/run.sh --connector hixl.vllm:HixlConnector \
    --kv-extra "{\"transport\": \"$t\"}" "$@" || rc=1
done
if [ "$(id -u)" = 0 ] && command -v etcd >/dev/null; then
  # Covers the same-host run over tcp (serve_e2e.py --extra '{"transport": "tcp"}'), which
  # runs in its place where there are no network namespaces.
  echo "== vllm serve across hosts (tools/hosts.sh: prefill in h1, decode in h2, proxy in h3, etcd in h4), token-exact against one server: by detected address with a fixed port, plain, with the link capped, with the prefill's link down mid-pull; through the directory by name; a prefill advertising loopback refused"
  HIXL_HOSTS_PREFIX=hxv "$VLLM_VENV/bin/python" bench/vllm/hosts_e2e.py --model "$VLLM_TINY_MODEL" \
    "${dtype[@]}" --reference-cache "$refs" --out "$PD_E2E_RESULTS/hosts" || rc=1
else
  echo "== vllm serve over HTTP over tcp: prefill, decode and python -m hixl.vllm.proxy, token-exact against one server (one host: the cross-host run needs root and etcd)"
  "$VLLM_VENV/bin/python" bench/vllm/serve_e2e.py --model "$VLLM_TINY_MODEL" "${dtype[@]}" \
    --extra '{"transport": "tcp"}' --reference-cache "$refs" --out "$PD_E2E_RESULTS/serve-tcp" || rc=1
fi
echo "== vllm serve over HTTP, prefill blocks of 32 -> decode blocks of 128 (each token pulled to its place in vLLM's CPU layout), token-exact against one server"
"$VLLM_VENV/bin/python" bench/vllm/serve_e2e.py --model "$VLLM_TINY_MODEL" --dtype float32 \
  --prefill-block-size 32 --decode-block-size 128 --extra '{"transport": "tcp"}' \
  --reference-cache "$refs" --out "$PD_E2E_RESULTS/serve-blocks-32-128" || rc=1
echo "== vllm serve over HTTP, prefill PP 2 -> decode PP 1 (each layer pulled from the stage holding it), token-exact against one server"
"$VLLM_VENV/bin/python" bench/vllm/serve_e2e.py --model "$VLLM_TINY_MODEL" --dtype float32 \
  --prefill-pp 2 --extra '{"transport": "tcp"}' --reference-cache "$refs" \
  --out "$PD_E2E_RESULTS/serve-pp2-pp1" || rc=1
hybrid=${VLLM_HYBRID_MODEL:-$(dirname "$VLLM_TINY_MODEL")/tiny-hybrid}
[ -f "$hybrid/config.json" ] || "$VLLM_VENV/bin/python" bench/vllm/make_tiny_llama.py \
  --size hybrid --out "$hybrid" >/dev/null
echo "== vllm serve over HTTP, a hybrid model (sliding-window and full layers, vLLM's hybrid allocator: two KV cache groups), prefill TP 2 -> decode TP 1 (the decode pulls its heads from both prefill ranks)"
"$VLLM_VENV/bin/python" bench/vllm/serve_e2e.py --model "$hybrid" --dtype float32 \
  --prefill-tp 2 --expect-groups 2 --reference-cache "$refs" \
  --out "$PD_E2E_RESULTS/serve-hybrid-p2d1" || rc=1
echo "== hixl.vllm host-buffer mode, forced on CPU caches (the mode accelerator caches use)"
RUNS=1 bench/vllm/run.sh --connector hixl.vllm:HixlConnector --kv-extra '{"host_buffer": true}' \
  --reference-cache "$refs" "${dtype[@]}" --batch 0 --num-prompts 4 || rc=1
if [ "${HIXL_VLLM_FAULTS:-1}" = 1 ]; then
  # A dense model's killed prefill (bench/vllm/run.sh --fault kill-prefill) is covered by the
  # hybrid model's below (the same death, two KV cache groups) and, across hosts, by
  # hosts_e2e.py's link taken down mid-pull: it runs only where the cross-host run cannot.
  if [ "$(id -u)" != 0 ] || ! command -v etcd >/dev/null; then
    echo "== fault: the prefill is killed once it handed out the transfer parameters (recompute)"
    RUNS=1 bench/vllm/run.sh --connector hixl.vllm:HixlConnector --fault kill-prefill \
      --reference-cache "$refs" "${dtype[@]}" --kv-load-failure-policy recompute --batch 0 || rc=1
  fi
  echo "== fault: the prefill is killed once it handed out the transfer parameters, a hybrid model (two KV cache groups): the failure is reported per request and vLLM recomputes the whole prompt"
  VLLM_TINY_MODEL="$hybrid" RUNS=1 bench/vllm/run.sh --connector hixl.vllm:HixlConnector \
    --fault kill-prefill --dtype float32 --kv-load-failure-policy recompute --batch 0 || rc=1
  echo "== fault: the decode never pulls; the prefill's lease expires and vLLM frees the blocks"
  RUNS=1 bench/vllm/run.sh --connector hixl.vllm:HixlConnector --fault no-pull \
    --kv-extra '{"lease_ms": 2000}' "${dtype[@]}" --batch 0 --skip-baseline || rc=1
fi
exit $rc
