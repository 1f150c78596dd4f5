#!/usr/bin/env bash
# Build the CPU-only SGLang venv for the PD-disaggregation benches (PyPI only;
# no GPU needed).  Idempotent: each step checks what is there first.
#
#   SGLANG_VENV=DIR ./setup.sh      (default DIR: ${TMPDIR:-/tmp}/hixl-sglang/venv;
#                                    CI caches it under ~/.cache/hixl-sglang/venv)
#
# Steps (times measured on the 2-vCPU VM, see README.md):
#   1. venv (Python 3.11: sglang 0.5.23 requires >=3.11; its wheel is
#      cp311-manylinux_2_34, compiled parts included)
#   2. torch==2.14.1, sglang 0.5.23's exact pin.  PyPI has no CPU-only build of
#      it for x86_64 (the +cpu wheels live on the PyTorch index, which is not
#      reachable): this is the CUDA 13 build, ~1.2 GB + ~3.3 GB of nvidia-*
#      wheels + triton 0.9 GB.  It runs on CPU (torch.cuda.is_available() is
#      False); `import torch` needs the nvidia libraries, so they stay.
#   3. sglang==0.5.23 --no-deps: its full requirement set cannot install or
#      makes no sense on a CPU-only machine (see DROPPED below)
#   4. the part of sglang's requirements that the PD path and the server's
#      modules import (KEEP below, pins taken from sglang's own metadata), plus
#      three that sglang imports without declaring them (UNDECLARED).  All of
#      sglang's pins (minus extras and the torch family) are passed as pip
#      constraints, so a transitive dependency cannot move torch or a pinned one.
#   5. mooncake-transfer-engine-non-cuda==0.3.13.post1 (`from mooncake.engine
#      import TransferEngine`, SGLang's default "mooncake" backend; tcp
#      transport, P2PHANDSHAKE metadata, no metadata server)
#   6. check: import the PD modules, sglang.srt.plugins and the entry-point
#      group, print versions, parse `python -m sglang.launch_server --help`, and
#      a two-process Mooncake tcp write on 127.0.0.1 through SGLang's own
#      MooncakeTransferEngine wrapper.  Exits non-zero on any failure.
#      SGLANG_SETUP_CHECK=0 skips it (the install steps alone take ~2 s on a
#      complete venv; the check imports SGLang twice, 15-50 s on a busy VM).
#
# The script never removes a package, so a plugin installed into the venv
# afterwards (hixl's `sglang.srt.plugins` entry point) stays across reruns.
set -euo pipefail
VENV="${SGLANG_VENV:-${TMPDIR:-/tmp}/hixl-sglang/venv}"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
TORCH=2.14.1
SGLANG=0.5.23
MOONCAKE=0.3.13.post1

# sglang's declared requirements that are installed (name as in its metadata;
# the version pin comes from there).  What needs each:
#   numpy msgspec requests pyzmq aiohttp prometheus-client:
#       disaggregation/{common,mooncake}/conn.py, utils.py at module level
#   psutil pydantic orjson pybase64 packaging pillow tqdm IPython transformers
#   tokenizers torchvision apache-tvm-ffi sentencepiece compressed-tensors gguf
#   openai partial_json_parser einops:
#       module-level imports on the way from disaggregation.{prefill,decode}
#       into managers/, mem_cache/, layers/, configs/ (found by importing each
#       target in a bare venv until nothing was missing)
#   fastapi uvicorn uvloop setproctitle python-multipart xgrammar soundfile:
#       managers.scheduler, entrypoints.{engine,http_server} (the real
#       server's processes; small, so kept for launch_server)
KEEP="numpy msgspec requests pyzmq aiohttp prometheus-client
psutil pydantic orjson pybase64 packaging pillow tqdm IPython transformers
tokenizers torchvision apache-tvm-ffi sentencepiece compressed-tensors gguf
openai partial_json_parser einops
fastapi uvicorn uvloop setproctitle python-multipart xgrammar soundfile"
# imported by sglang at module level but not in its metadata (there they come
# only through dropped packages: datasets -> dill, outlines -> jsonschema)
UNDECLARED="dill jsonschema starlette"
# DROPPED (the rest of sglang 0.5.23's requirements), and why:
#   CUDA-only kernels / libraries, no use or no wheel without a GPU:
#     flashinfer_python[cu13] flash-attn-4 sglang-kernel (sgl-kernel CUDA build)
#     sgl-deep-ep sgl-deep-gemm sgl-flash-mla quack-kernels humming-kernels[cu13]
#     nvidia-cutlass-dsl[cu13] nvidia-mathdx nvshmem4py-cu13 cuda-python
#     nvidia-ml-py tilelang torch_memory_saver
#   kernels (fetches compiled kernels from the Hugging Face hub at run time)
#   torch family: torchaudio==2.11.0 (its compiled extension is built against
#     torch 2.11, not the pinned 2.14.1) and torchcodec (video decoding),
#     neither imported on these paths
#   not imported by the PD path nor the server's modules at import time
#   (model loading, tokenizer/grammar/multimodal back-ends, tools): anthropic
#     blobfile build datasets deepseek-recipe distro easydict interegular llguidance
#     mistral_common modelscope ninja numba==0.65.1
#     openai-harmony outlines py-spy python-dateutil regex scipy
#     smg-grpc-servicer tiktoken timm tml-renderers watchfiles xxhash zstandard

step() { echo "== $(date -u +%H:%M:%S) $*"; T0=$(date +%s); }
done_() { echo "   took $(( $(date +%s) - T0 )) s"; }
TSTART=$(date +%s)

if [ ! -x "$VENV/bin/python" ]; then
  step "venv $VENV ($($PY --version))"
  mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv "$VENV"
  done_
fi
VPY="$VENV/bin/python"
PIP=("$VENV/bin/pip" install --disable-pip-version-check)
have() {  # have DIST VERSION: is DIST==VERSION installed in the venv?
  "$VPY" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null
}

if ! have torch "$TORCH"; then
  step "torch==$TORCH (PyPI's CUDA 13 build; runs on CPU)"
  "${PIP[@]}" "torch==$TORCH"
  done_
fi

if ! have sglang "$SGLANG"; then
  step "sglang==$SGLANG --no-deps"
  "${PIP[@]}" --no-deps "sglang==$SGLANG"
  done_
fi

# Requirement and constraint files from sglang's metadata.  Writing them and
# checking whether they are met takes well under a second; pip runs only when
# something is missing.
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
rc=0
KEEP="$KEEP" UNDECLARED="$UNDECLARED" "$VPY" - "$WORK" <<'EOF' || rc=$?
import importlib.metadata as m, os, sys
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name as canon

work = sys.argv[1]
keep = {canon(x) for x in os.environ["KEEP"].split()}
reqs, cons, dropped = [], [], []
for line in m.requires("sglang"):
    r = Requirement(line)
    if r.marker and not r.marker.evaluate({"extra": ""}):
        continue  # an extra, or another platform's requirement
    n = canon(r.name)
    if n in keep:
        keep.discard(n)
        reqs.append(r)
    elif n != "torch":  # torch: step 2
        dropped.append(r.name)
    # sglang's pins as constraints, minus torchaudio==2.11.0 (built for torch
    # 2.11; nothing kept pulls it) and extras (not allowed in constraints)
    if r.specifier and n not in ("torchaudio", "torchcodec"):
        cons.append(f"{r.name}{r.specifier}")
if keep:
    sys.exit(f"KEEP names not in sglang's requirements: {sorted(keep)}")
reqs += [Requirement(x) for x in os.environ["UNDECLARED"].split()]
with open(f"{work}/reqs.txt", "w") as f:
    f.write("\n".join(f"{r.name}{r.specifier}" for r in reqs) + "\n")
with open(f"{work}/cons.txt", "w") as f:
    f.write("\n".join(cons) + "\n")
with open(f"{work}/dropped.txt", "w") as f:
    f.write(" ".join(dropped) + "\n")
missing = []
for r in reqs:
    try:
        v = m.version(r.name)
    except m.PackageNotFoundError:
        missing.append(r.name)
        continue
    if not r.specifier.contains(v, prereleases=True):
        missing.append(f"{r.name} {v} (want {r.specifier})")
if missing:
    print("   missing:", ", ".join(missing))
    sys.exit(10)
EOF
if [ "$rc" = 10 ]; then
  step "sglang's kept requirements ($(wc -l < "$WORK/reqs.txt") of them; dropped: $(cat "$WORK/dropped.txt"))"
  "${PIP[@]}" -r "$WORK/reqs.txt" -c "$WORK/cons.txt"
  done_
elif [ "$rc" != 0 ]; then
  exit "$rc"
fi

if ! have mooncake-transfer-engine-non-cuda "$MOONCAKE"; then
  step "mooncake-transfer-engine-non-cuda==$MOONCAKE"
  "${PIP[@]}" "mooncake-transfer-engine-non-cuda==$MOONCAKE" -c "$WORK/cons.txt"
  done_
fi

if [ "${SGLANG_SETUP_CHECK:-1}" = 0 ]; then
  echo "venv ready (check skipped): $VENV ($(( $(date +%s) - TSTART )) s in all)"
  exit 0
fi

step "check (imports, versions, launch_server --help, mooncake tcp between two processes)"
# SGLang and Mooncake log a lot to stderr (CPU-only warnings, glog): keep it
# in a file and show it only on failure.
export GLOG_minloglevel=2
if ! "$VPY" - > "$WORK/check.out" 2> "$WORK/check.err" <<'EOF'
import importlib, importlib.metadata as m, inspect, os, subprocess, sys, time

mods = [
    "sglang.srt.disaggregation.base.conn",
    "sglang.srt.disaggregation.common.conn",
    "sglang.srt.disaggregation.mooncake.conn",
    "sglang.srt.disaggregation.utils",
    "sglang.srt.disaggregation.prefill",
    "sglang.srt.disaggregation.decode",
    "sglang.srt.disaggregation.fake.conn",
    "sglang.srt.plugins",
    "sglang.srt.arg_groups.choices",
    "sglang.srt.server_args",
    "sglang.srt.distributed.device_communicators.mooncake_transfer_engine",
    "sglang.srt.managers.scheduler",
    "sglang.srt.entrypoints.engine",
    "sglang.srt.entrypoints.http_server",
    "mooncake.engine",
]
t0 = time.time()
for name in mods:
    importlib.import_module(name)
print(f"imported {len(mods)} modules in {time.time() - t0:.1f} s")

import torch
from sglang.srt import plugins
from sglang.srt.arg_groups import choices
from sglang.srt.disaggregation.utils import TransferBackend, KVClassType, get_kv_class

# what a transfer-backend plugin relies on in this sglang
assert plugins.GENERAL_PLUGINS_GROUP == "sglang.srt.plugins", plugins.GENERAL_PLUGINS_GROUP
assert callable(plugins.load_plugins)
assert callable(choices.add_disagg_transfer_backend_choices)
assert list(inspect.signature(get_kv_class).parameters) == ["transfer_backend", "class_type"]
assert get_kv_class(TransferBackend.MOONCAKE, KVClassType.MANAGER).__name__ == "MooncakeKVManager"
assert not torch.cuda.is_available()
eps = [f"{e.name}={e.value} ({e.dist.name} {e.dist.version})"
       for e in m.entry_points(group=plugins.GENERAL_PLUGINS_GROUP)]

v = m.version
print(f"python {sys.version.split()[0]} | torch {torch.__version__} (cuda available: False)"
      f" | sglang {v('sglang')} | transformers {v('transformers')}"
      f" | mooncake-transfer-engine-non-cuda {v('mooncake-transfer-engine-non-cuda')}")
print(f"built-in disagg transfer backends: {choices.DISAGG_TRANSFER_BACKEND_CHOICES}")
print(f"sglang.srt.plugins entry points: {eps or 'none'}")

# Mooncake over tcp between two processes on 127.0.0.1, no metadata server
# (P2PHANDSHAKE).  Target: mooncake.engine.TransferEngine as is, a registered
# host buffer.  Initiator (here): SGLang's MooncakeTransferEngine wrapper as
# SGLang's mooncake backend makes it, with MOONCAKE_PROTOCOL=tcp, writing a CPU
# torch tensor with transfer_sync_write.
N = 4 << 20
TARGET = r"""
import sys, numpy as np
from mooncake.engine import TransferEngine
N = int(sys.argv[1])
te = TransferEngine()
assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
buf = np.zeros(N, dtype=np.uint8)
assert te.register_memory(buf.ctypes.data, N) == 0
print(f"127.0.0.1:{te.get_rpc_port()} {buf.ctypes.data}", flush=True)
sys.stdin.readline()
want = (np.arange(N, dtype=np.int64) % 251).astype(np.uint8)
print("match" if np.array_equal(buf, want) else "MISMATCH", flush=True)
"""
os.environ["MOONCAKE_PROTOCOL"] = "tcp"
os.environ["MC_FORCE_TCP"] = "1"
from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import MooncakeTransferEngine
t = subprocess.Popen([sys.executable, "-c", TARGET, str(N)], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, text=True)
try:
    line = t.stdout.readline().split()
    assert len(line) == 2, f"mooncake target did not start (rc={t.poll()})"
    peer, peer_ptr = line[0], int(line[1])
    te = MooncakeTransferEngine(hostname="127.0.0.1")
    src = (torch.arange(N, dtype=torch.int64) % 251).to(torch.uint8)
    te.register(src.data_ptr(), N)
    t1 = time.perf_counter()
    ret = te.transfer_sync(peer, src.data_ptr(), peer_ptr, N)
    dt = time.perf_counter() - t1
    assert ret == 0, f"transfer_sync_write returned {ret}"
    t.stdin.write("written\n")
    t.stdin.flush()
    verdict = t.stdout.readline().strip()
    assert verdict == "match", f"target saw {verdict!r}"
    print(f"mooncake tcp: {te.get_session_id()} -> {peer}: {N} B written"
          f" ({dt * 1e3:.1f} ms) and verified by the target")
finally:
    if not t.stdin.closed:
        t.stdin.close()
    try:
        t.wait(timeout=30)
    except subprocess.TimeoutExpired:
        t.kill()
EOF
then
  cat "$WORK/check.out"
  echo "-- check failed; stderr (last 40 lines):"
  tail -40 "$WORK/check.err"
  exit 1
fi
cat "$WORK/check.out"
if ! "$VPY" -m sglang.launch_server --help > "$WORK/help.out" 2> "$WORK/check.err" \
   || ! grep -q -- "--disaggregation-transfer-backend" "$WORK/help.out"; then
  echo "-- python -m sglang.launch_server --help failed:"
  tail -20 "$WORK/check.err"
  exit 1
fi
echo "launch_server --help: $(grep -c -- '^  --' "$WORK/help.out") options; after load_plugins():" \
  "$(grep -m1 -o -- '--disaggregation-transfer-backend {[^}]*}' "$WORK/help.out")"
done_
echo "venv ready: $VENV ($(( $(date +%s) - TSTART )) s in all)"
