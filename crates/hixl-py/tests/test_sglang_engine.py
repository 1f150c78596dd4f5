"""hixl.sglang's engine (the five calls SGLang's transfer tier makes) against a real target
process, over tcp and the fabric; SGLang itself is not needed here (tools/sglang-e2e.sh runs
the backend inside SGLang's own code)."""

import hashlib
import os

import numpy as np
import pytest

from conftest import TRANSPORTS, sigstop
from hixl.sglang._engine import HixlTransferEngine, engine_options

MiB = 1 << 20


@pytest.fixture(params=TRANSPORTS)
def transport(request):
    return request.param


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def setup(spawn, transport):
    child = spawn("engine_child.py", transport, str(4 * MiB))
    eng = HixlTransferEngine("127.0.0.1", {"hixl.Transport": transport})
    assert eng.send_probe(child.hello["engine"]) == 0
    remote = eng._peer(child.hello["engine"]).region("buf").addr
    return child, eng, remote


def test_batch_write_lands_every_piece_at_its_address(spawn, transport):
    child, eng, remote = setup(spawn, transport)
    try:
        src = np.random.default_rng(7).integers(0, 256, 2 * MiB, dtype=np.uint8)
        assert eng.batch_register([src.ctypes.data], [src.nbytes]) == 0
        # 64 pages of 16 KiB, written in reverse page order (as scattered KV pages land)
        page = 16384
        bufs = [src.ctypes.data + i * page for i in range(64)]
        dsts = [remote + (63 - i) * page for i in range(64)]
        assert eng.batch_transfer_sync(child.hello["engine"], bufs, dsts, [page] * 64) == 0
        want = b"".join(src[(63 - j) * page:(64 - j) * page].tobytes() for j in range(64))
        assert child.ask(cmd="digest", off=0, len=64 * page)["sha"] == sha(want)
        assert eng.bytes_written == 64 * page
        assert eng.last_error(child.hello["engine"]) is None
        # a single piece (SGLang's transfer_sync)
        assert eng.transfer_sync(child.hello["engine"], src.ctypes.data, remote + MiB, 100) == 0
        assert eng.batch_deregister([src.ctypes.data]) == 0
    finally:
        eng.close()


def test_a_write_outside_the_peers_memory_fails_and_says_why(spawn, transport):
    child, eng, remote = setup(spawn, transport)
    try:
        src = np.zeros(8192, dtype=np.uint8)
        assert eng.batch_register([src.ctypes.data], [src.nbytes]) == 0
        rc = eng.batch_transfer_sync(child.hello["engine"], [src.ctypes.data],
                                     [remote + 4 * MiB], [4096])
        assert rc == -1
        why = eng.last_error(child.hello["engine"])
        assert why is not None and child.hello["engine"] in why, why
        # unequal lists are refused before anything moves
        assert eng.batch_transfer_sync(child.hello["engine"], [src.ctypes.data], [], [1]) == -1
        assert "1 local addresses, 0 remote" in eng.last_error(child.hello["engine"])
        # a write that lands clears the session's failure
        assert eng.batch_transfer_sync(child.hello["engine"], [src.ctypes.data], [remote],
                                       [4096]) == 0
        assert eng.last_error(child.hello["engine"]) is None
    finally:
        eng.close()


def test_a_dead_peer_fails_the_write_as_peer_lost_or_timeout(spawn, transport, monkeypatch):
    monkeypatch.setenv("HIXL_SGLANG_TIMEOUT_S", "2")
    child, eng, remote = setup(spawn, transport)
    try:
        src = np.zeros(MiB, dtype=np.uint8)
        assert eng.batch_register([src.ctypes.data], [src.nbytes]) == 0
        sigstop(child.hello["pid"])
        child.proc.kill()
        child.proc.wait()
        rc = eng.batch_transfer_sync(child.hello["engine"], [src.ctypes.data], [remote], [MiB])
        assert rc == -1
        why = eng.last_error(child.hello["engine"])
        # the link broke (peer lost), or it was found down and linking again was refused
        assert any(w in why for w in ("peer lost", "timeout", "Connection refused")), why
        assert why.startswith(f"a write of 1 pieces to {child.hello['engine']}: "), why
        # the probe SGLang's failed-session loop sends fails too
        assert eng.send_probe(child.hello["engine"]) == -1
    finally:
        eng.close()


def test_settings_are_checked_and_name_the_bad_value():
    assert engine_options({"HIXL_SGLANG_TRANSPORT": "tcp"}) == {"hixl.Transport": "tcp"}
    assert engine_options({}) == {}
    with pytest.raises(ValueError, match="HIXL_SGLANG_TRANSPORT = 'rdma'"):
        engine_options({"HIXL_SGLANG_TRANSPORT": "rdma"})
    os.environ["HIXL_SGLANG_TIMEOUT_S"] = "soon"
    try:
        with pytest.raises(ValueError, match="HIXL_SGLANG_TIMEOUT_S='soon'"):
            HixlTransferEngine("127.0.0.1", {})
    finally:
        del os.environ["HIXL_SGLANG_TIMEOUT_S"]
