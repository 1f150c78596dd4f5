"""The wheel carries the verbs transport, with libibverbs loaded at run time: it imports and works
on a host without rdma-core (libibverbs hidden for real, in a private mount namespace), and
``auto`` then says why verbs is off. With an RDMA device (``HIXL_VERBS_DEVICE``) an engine pair
moves bytes over verbs."""

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from conftest import HERE

LIBRARY = "libibverbs.so.1"

# Run in a fresh interpreter: whether libibverbs is mapped after `import hixl`, then what an
# engine with `auto` says, a transfer between two engines, and a forced verbs engine.
CHILD = r"""
import json, sys
def mapped():
    with open("/proc/self/maps") as f:
        return any(l.split()[-1].rsplit("/", 1)[-1].startswith("libibverbs.so")
                   for l in f if len(l.split()) >= 6)
import hixl
out = {"mapped_after_import": mapped()}
target = hixl.Engine("127.0.0.1:0")
buf = bytearray(range(256)) * 64
target.register(buf, name="kv")
engine = hixl.Engine("127.0.0.1")
out["info"] = engine.info()
local = engine.register(bytearray(len(buf)))
peer = engine.connect(target.local_engine).wait(10)
out["transport"] = peer.transport
peer.read([(local.addr, peer.region("kv").addr, len(buf))]).wait(10)
out["read_ok"] = local.read(0, len(buf)) == bytes(buf)
out["mapped_after_engine"] = mapped()
try:
    hixl.Engine("127.0.0.1", {"hixl.Transport": "verbs"}).close()
    out["forced"] = None
except hixl.HixlError as e:
    out["forced"] = [type(e).__name__, str(e)]
engine.close(); target.close()
print(json.dumps(out))
"""


def run_child(prefix: Optional[List[str]] = None) -> Dict[str, Any]:
    argv = (prefix or []) + [sys.executable, "-c", CHILD]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"{argv[:3]}... exited {p.returncode}: {p.stderr[-2000:]}"
    out: Dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def real_library() -> Optional[Path]:
    """The file the dynamic loader opens for libibverbs.so.1, or None when there is none."""
    try:
        ctypes.CDLL(LIBRARY)
    except OSError:
        return None
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and Path(parts[5]).name.startswith("libibverbs.so"):
                return Path(parts[5])
    return None


def check_without_library(out: Dict[str, Any]) -> None:
    assert not out["mapped_after_import"]
    assert not out["mapped_after_engine"]
    assert out["info"]["verbs_device"] is None
    reason = out["info"]["verbs_reason"]
    assert LIBRARY in reason, reason
    # The wheel works: a same-host pair takes the fabric, bytes verified.
    assert out["read_ok"]
    assert out["transport"].startswith("fabric"), out["transport"]
    # Forcing verbs is refused, and the error says why.
    assert out["forced"] is not None, "hixl.Transport=verbs was accepted without libibverbs"
    kind, msg = out["forced"]
    assert kind == "UnsupportedError" and LIBRARY in msg, out["forced"]


def test_libibverbs_is_not_linked_only_loaded_when_an_engine_starts() -> None:
    out = run_child()
    assert not out["mapped_after_import"], "importing hixl mapped libibverbs: the wheel links it"
    assert out["read_ok"]
    if real_library() is None:
        # This host really has no rdma-core.
        check_without_library(out)
    else:
        assert out["mapped_after_engine"], "an engine with auto did not load libibverbs"
        if out["info"]["verbs_device"] is None:
            # Loaded, but no RDMA device here: the reason is libibverbs' answer, not the load.
            assert "not found (rdma-core" not in out["info"]["verbs_reason"]


def test_without_rdma_core_the_wheel_works_and_auto_says_why(tmp_path: Path) -> None:
    lib = real_library()
    if lib is None:
        check_without_library(run_child())  # no rdma-core on this host: nothing to hide
        return
    if os.geteuid() != 0:
        pytest.skip("hiding libibverbs needs root (a bind mount in a private mount namespace)")
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("hiding libibverbs needs unshare(1) (util-linux)")
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    # A private mount namespace in which the library's file is an empty one: dlopen fails as on
    # a host without rdma-core (the mount is gone when the child exits).
    prefix = [unshare, "--mount", "--propagation", "private", "sh", "-c",
              'mount --bind "$0" "$1" && shift && exec "$@"', str(empty), str(lib)]
    probe = subprocess.run(prefix[:-3] + ['mount --bind "$0" "$1"', str(empty), str(lib)],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here: {probe.stderr.strip()}")
    out = run_child(prefix)
    check_without_library(out)
    assert "cannot be loaded" in out["info"]["verbs_reason"] or \
        "not found" in out["info"]["verbs_reason"], out["info"]["verbs_reason"]


@pytest.mark.skipif(not os.environ.get("HIXL_VERBS_DEVICE"),
                    reason="HIXL_VERBS_DEVICE names no RDMA device (e.g. rxe0)")
def test_engine_pair_over_verbs() -> None:
    p = subprocess.run([sys.executable, str(HERE / "verbs_pair.py")], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
