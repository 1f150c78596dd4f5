"""hixl.Engine between two real processes over real sockets (tcp) and the same-host fabric."""

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

import hixl
from conftest import HERE, TRANSPORTS, sigstop

MiB = 1 << 20


def pattern(n: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture(params=TRANSPORTS)
def transport(request):
    return request.param


def pair(spawn, transport, size=16 * MiB, pooled=False):
    args = [transport, str(size)] + (["pooled"] if pooled else [])
    child = spawn("engine_child.py", *args)
    eng = hixl.Engine("127.0.0.1:0", {"hixl.Transport": transport})
    peer = eng.connect(child.hello["engine"], timeout=5.0).wait()
    assert peer.transport.startswith(transport), peer.transport
    return child, eng, peer, peer.region("buf")


def test_write_and_read_back_every_form_of_buffer(spawn, transport):
    child, eng, peer, rr = pair(spawn, transport)
    try:
        src = np.frombuffer(pattern(4 * MiB, 1), dtype=np.uint8).copy()
        reg = eng.register(src, access=hixl.Access.LOCAL)
        # an N×3 uint64 array of 64 descriptors of 64 KiB
        descs = np.array([[reg.addr + k * 65536, rr.addr + k * 65536, 65536] for k in range(64)],
                         dtype=np.uint64)
        peer.write(descs).wait(10)
        assert child.ask(cmd="digest", off=0, len=4 * MiB)["sha"] == sha(src.tobytes())
        # a bytearray, list-of-tuples read back
        back = bytearray(4 * MiB)
        breg = eng.register(back)
        t = peer.read([(breg.addr, rr.addr, 2 * MiB), (breg.addr + 2 * MiB, rr.addr + 2 * MiB, 2 * MiB)])
        assert t.wait(10) is None
        assert t.status() == hixl.TransferStatus.COMPLETED
        assert bytes(back) == src.tobytes()
        # a memoryview slice of a larger buffer, and an int array converted on the way
        big = bytearray(pattern(MiB, 2))
        mv = memoryview(big)[4096:4096 + 65536]
        mreg = eng.register(mv)
        peer.write(np.array([[mreg.addr, rr.addr + 8 * MiB, 65536]], dtype=np.int64)).wait(5)
        assert child.ask(cmd="digest", off=8 * MiB, len=65536)["sha"] == sha(bytes(big[4096:4096 + 65536]))
        # a tensor through __dlpack__ only (no buffer protocol), as a CPU torch.Tensor is
        class DlpackOnly:
            def __init__(self, a):
                self.a = a
            def __dlpack__(self, stream=None):
                return self.a.__dlpack__()
            def __dlpack_device__(self):
                return self.a.__dlpack_device__()
        arr = np.zeros((256, 256), dtype=np.float32)
        dreg = eng.register(DlpackOnly(arr))
        assert dreg.addr == arr.ctypes.data and dreg.len == arr.nbytes
        peer.read([(dreg.addr, rr.addr, arr.nbytes)]).wait(5)
        assert arr.tobytes() == src.tobytes()[: arr.nbytes]
        # by the peer's name through the engine, with an array
        arr[:] = 0
        eng.transfer(peer.name, hixl.TransferOp.READ,
                     np.array([[dreg.addr, rr.addr, arr.nbytes]], dtype=np.uint64)).wait(5)
        assert arr.tobytes() == src.tobytes()[: arr.nbytes]
        for r in (reg, breg, mreg, dreg):
            eng.deregister(r).wait(5)
    finally:
        eng.close()


def test_strided_descriptors(spawn, transport):
    child, eng, peer, rr = pair(spawn, transport)
    try:
        src = bytearray(pattern(MiB, 3))
        reg = eng.register(src)
        child.ask(cmd="fill", off=0, len=2 * MiB, byte=0xEE)
        # every other 4 KiB block of 512 KiB locally lands packed remotely
        d = np.array([[reg.addr, rr.addr, 4096, 8192, 4096, 64]], dtype=np.uint64)
        peer.transfer_strided(hixl.TransferOp.WRITE, d).wait(5)
        want = b"".join(bytes(src[k * 8192: k * 8192 + 4096]) for k in range(64))
        assert child.ask(cmd="digest", off=0, len=len(want))["sha"] == sha(want)
        assert child.ask(cmd="count", off=len(want), len=4096, byte=0xEE)["n"] == 4096
        # Degenerate shapes are ordinary errors naming the descriptor, not a PanicException
        # (which `except Exception` does not catch): zero-length pieces whose span is not
        # zero, no pieces, remote pieces stacked on each other.
        for row, says in [([reg.addr, rr.addr, 0, 512, 1024, 16], "descriptor 1 has zero length"),
                          ([reg.addr, rr.addr, 4096, 8192, 4096, 0], "count is 0"),
                          ([reg.addr, rr.addr, 4096, 4096, 0, 4], "0 (remote)")]:
            bad = np.array([[reg.addr, rr.addr, 4096, 8192, 4096, 1], row], dtype=np.uint64)
            for op in (hixl.TransferOp.WRITE, hixl.TransferOp.READ):
                with pytest.raises(hixl.ParamInvalidError) as e:
                    peer.transfer_strided(op, bad).wait(5)
                assert says in str(e.value) and e.value.status == 103900, e.value
        peer.transfer_strided(hixl.TransferOp.WRITE, d).wait(5)
    finally:
        eng.close()


def test_telemetry_records_and_prometheus_text(spawn, transport):
    child, eng, peer, rr = pair(spawn, transport)
    try:
        src = bytearray(pattern(MiB, 5))
        reg = eng.register(src)
        eng.take_transfer_records()
        peer.write([(reg.addr, rr.addr, 65536), (reg.addr + 65536, rr.addr + 65536, 4096)]).wait(5)
        peer.read([(reg.addr, rr.addr, 4096)]).wait(5)
        with pytest.raises(hixl.HixlError):
            peer.write([(reg.addr, rr.addr + 64 * MiB, 16)]).wait(5)
        recs = eng.take_transfer_records()
        assert [(r["op"], r["bytes"], r["descriptors"], r["outcome"]) for r in recs] == [
            ("write", 69632, 2, "completed"), ("read", 4096, 1, "completed"),
            ("write", 16, 1, "failed")], recs
        assert all(r["transport"] == transport and r["peer"] == peer.name for r in recs)
        assert all(r["duration_s"] >= 0 and r["post_s"] >= 0 for r in recs)
        assert eng.take_transfer_records() == []
        text = eng.metrics_text()
        labels = (f'engine="{eng.local_engine}",peer="{peer.name}",transport="{transport}",'
                  'op="read"')
        assert f"hixl_transfer_bytes_total{{{labels}}} 4096" in text, text
        assert f'hixl_transfers_total{{{labels},outcome="completed"}} 1' in text, text
        assert "# TYPE hixl_transfer_duration_seconds histogram" in text
        # The same text over HTTP, for Prometheus.
        srv = eng.serve_metrics("127.0.0.1:0")
        try:
            with urllib.request.urlopen(f"http://{srv.local_addr}/metrics", timeout=5) as r:
                body = r.read().decode()
            assert f"hixl_transfer_bytes_total{{{labels}}} 4096" in body, body
        finally:
            srv.close()
    finally:
        eng.close()


def test_a_thousand_concurrent_awaitables(spawn, transport):
    child, eng, peer, rr = pair(spawn, transport)
    try:
        src = bytearray(pattern(4 * MiB, 4))
        reg = eng.register(src)

        async def go():
            ops = [peer.write([(reg.addr + k * 4096, rr.addr + k * 4096, 4096)]) for k in range(1000)]
            res = await asyncio.gather(*ops)
            assert res == [None] * 1000
            assert all(o.status() == hixl.TransferStatus.COMPLETED for o in ops)

        asyncio.run(go())
        assert child.ask(cmd="digest", off=0, len=1000 * 4096)["sha"] == sha(bytes(src[: 1000 * 4096]))
        assert eng.ops_in_flight == 0
    finally:
        eng.close()


def test_notifies_both_ways(spawn, transport):
    child, eng, peer, rr = pair(spawn, transport)
    try:
        peer.notify("kv_ready", b"req-1").wait(5)
        deadline = time.time() + 5
        got = []
        while not got and time.time() < deadline:
            got = child.ask(cmd="notifies")["notifies"]
        assert [g[1:] for g in got] == [["kv_ready", "req-1"]]
        child.ask(cmd="connect", to=eng.local_engine)

        async def recv():
            it = eng.notifications()
            child.ask(cmd="notify", to=eng.local_engine, name="done", msg="req-1")
            return await asyncio.wait_for(it.__anext__(), 5)

        n = asyncio.run(recv())
        assert (n.name, n.msg) == (b"done", b"req-1")
        with pytest.raises(hixl.ParamInvalidError):
            peer.notify("n" * 1025, "m").wait(5)
        # 4096 undrained notifies from one link fill the receiver's budget
        async def flood():
            await asyncio.gather(*(peer.notify("q", str(k)) for k in range(4096)))
            with pytest.raises(hixl.ResourceExhaustedError) as e:
                await peer.notify("q", "over")
            assert e.value.status == 203900

        asyncio.run(flood())
        assert len(child.ask(cmd="notifies")["notifies"]) == 4096
        peer.notify("q", "again").wait(5)
    finally:
        eng.close()


def test_cancelled_queued_write_never_lands(spawn):
    # One tcp data connection: the second write queues behind all of the first.
    child = spawn("engine_child.py", "tcp", str(48 * MiB))
    eng = hixl.Engine("127.0.0.1", {"hixl.Transport": "tcp", "hixl.TcpStreams": "1",
                                    "hixl.TcpChunkBytes": "64K"})
    try:
        peer = eng.connect(child.hello["engine"], timeout=5.0).wait()
        rr = peer.region("buf")
        src = bytearray(pattern(40 * MiB, 5))
        reg = eng.register(src)
        counted = 0
        for _ in range(5):
            child.ask(cmd="fill", off=32 * MiB, len=8 * MiB, byte=0xAB)
            a = peer.write([(reg.addr, rr.addr, 32 * MiB)])
            t0 = time.perf_counter()
            b = peer.write([(reg.addr + 32 * MiB, rr.addr + 32 * MiB, 8 * MiB)])
            assert b.cancel()
            dropped = time.perf_counter() - t0
            a.wait(30)
            long = time.perf_counter() - t0
            assert b.status() == hixl.TransferStatus.CANCELLED
            with pytest.raises(hixl.TransferCancelledError):
                b.wait(1)
            deadline = time.time() + 5
            while eng.ops_in_flight and time.time() < deadline:
                time.sleep(0.01)
            landed = 8 * MiB - child.ask(cmd="count", off=32 * MiB, len=8 * MiB, byte=0xAB)["n"]
            if dropped * 4 >= long:
                continue  # this thread stalled while the first write went: the run cannot count
            assert landed == 0, f"{landed} bytes of a cancelled, queued write landed"
            counted += 1
            break
        assert counted == 1
    finally:
        eng.close()


def test_cancelled_read_lands_nothing_after_deregister(spawn, transport):
    child, eng, peer, rr = pair(spawn, transport, size=32 * MiB)
    try:
        child.ask(cmd="fill", off=0, len=32 * MiB, byte=0x5A)
        dst = bytearray(b"\xc3" * (32 * MiB))
        reg = eng.register(dst)

        async def go():
            task = asyncio.ensure_future(peer.read([(reg.addr, rr.addr, 32 * MiB)]))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(go())
        eng.deregister(reg).wait(10)
        snap = bytes(dst)
        assert set(snap) <= {0xC3, 0x5A}
        time.sleep(0.3)
        assert bytes(dst) == snap, "bytes landed after deregistration returned"
    finally:
        eng.close()


def test_errors_name_the_offending_value(spawn):
    child, eng, peer, rr = pair(spawn, "tcp")
    try:
        buf = bytearray(65536)
        reg = eng.register(buf)
        with pytest.raises(hixl.ParamInvalidError) as e:
            peer.write([(0x1000, rr.addr, 16)]).wait(5)
        assert e.value.value == 0x1000 and e.value.status == 103900
        with pytest.raises(hixl.ParamInvalidError) as e:
            peer.write([(reg.addr, rr.addr + rr.len - 8, 16)]).wait(5)
        assert e.value.value == rr.addr + rr.len - 8
        with pytest.raises(hixl.ParamInvalidError):
            peer.write([(reg.addr, rr.addr, 0)]).wait(5)
        with pytest.raises(hixl.ParamInvalidError) as e:
            peer.write([(reg.addr, rr.addr, 16)], timeout=0).wait(5)
        with pytest.raises(hixl.ParamInvalidError) as e:
            peer.write(np.zeros((4, 2), dtype=np.uint64))
        assert e.value.value == (4, 2)
        with pytest.raises(hixl.ParamInvalidError) as e:
            peer.write(np.array([[-1, 0, 1]], dtype=np.int64))
        with pytest.raises(hixl.ParamInvalidError) as e:
            hixl.Engine("127.0.0.1", {"hixl.NoSuchKey": "1"})
        assert e.value.value == "hixl.NoSuchKey"
        with pytest.raises(hixl.ParamInvalidError) as e:
            hixl.Engine("not-an-ip:1")
        assert e.value.value == "not-an-ip:1"
        with pytest.raises(hixl.ParamInvalidError):
            eng.register(b"read-only bytes")
        with pytest.raises(hixl.ParamInvalidError):
            eng.register(12345)
        with pytest.raises(hixl.ParamInvalidError):
            eng.register(np.zeros((8, 8))[:, ::2])

        class MockGpuTensor:  # a mock: no GPU here; only its DLPack device says CUDA
            def __dlpack_device__(self):
                return (2, 0)

            def __dlpack__(self, stream=None):
                raise AssertionError("a device tensor is refused before it is exported")

        with pytest.raises(hixl.UnsupportedError) as e:
            eng.register(MockGpuTensor())
        assert e.value.value == (2, 0) and e.value.status == 103905
        with pytest.raises(hixl.NotConnectedError) as e:
            eng.peer("127.0.0.1:1")
        assert e.value.value == "127.0.0.1:1"
        with pytest.raises(hixl.AlreadyConnectedError):
            eng.connect(child.hello["engine"]).wait(5)
        with pytest.raises(hixl.HixlError):
            eng.connect("127.0.0.1:1", timeout=0.5).wait(5)
        # a peer that stops answering: the op's own timeout ends it
        sigstop(child.proc.pid)
        try:
            big = bytearray(32 * MiB)
            breg = eng.register(big)
            t = peer.write([(breg.addr, rr.addr, 16 * MiB)], timeout=0.2)
            with pytest.raises(hixl.HixlTimeoutError):
                t.wait()
            assert t.status() == hixl.TransferStatus.TIMED_OUT
            t2 = peer.write([(breg.addr, rr.addr, 16 * MiB)])
            with pytest.raises(hixl.HixlTimeoutError):
                t2.wait(0.2)
        finally:
            os.kill(child.proc.pid, signal.SIGCONT)
        eng.disconnect(child.hello["engine"]).wait(5)
        with pytest.raises(hixl.NotConnectedError):
            peer.write([(reg.addr, rr.addr, 16)]).wait(5)
        eng.close()
        with pytest.raises(hixl.FailedError):
            eng.register(bytearray(16))
        with pytest.raises(hixl.FailedError):
            eng.connect(child.hello["engine"])
    finally:
        eng.close()


def test_a_dead_peer_fails_every_op(spawn, transport):
    child, eng, peer, rr = pair(spawn, transport, size=64 * MiB)
    try:
        src = bytearray(64 * MiB)
        reg = eng.register(src)

        async def go():
            ops = [peer.write([(reg.addr, rr.addr, 64 * MiB)]) for _ in range(4)]
            child.proc.kill()
            return await asyncio.gather(*ops, return_exceptions=True)

        res = asyncio.run(asyncio.wait_for(go(), 30))
        # every op resolved: landed before the kill, or failed with a hixl error
        assert all(r is None or isinstance(r, hixl.HixlError) for r in res), res
        with pytest.raises(hixl.HixlError):
            peer.write([(reg.addr, rr.addr, 4096)]).wait(10)
        deadline = time.time() + 10
        while eng.ops_in_flight and time.time() < deadline:
            time.sleep(0.01)
        assert eng.ops_in_flight == 0
    finally:
        eng.close()


@pytest.mark.parametrize("mode", ["idle", "inflight", "async"])
def test_interpreter_exits_cleanly_with_links_and_transfers_open(spawn, transport, mode):
    target = spawn("engine_child.py", transport, str(32 * MiB))
    p = subprocess.run([sys.executable, str(HERE / "exit_child.py"), transport, target.hello["engine"], mode],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert "posted" in p.stdout
    # the target is unharmed
    assert target.ask(cmd="count", off=0, len=16, byte=0)["ok"]


def test_a_dropped_region_keeps_its_memory_until_deregistered():
    """Dropping a Region does not deregister it (a peer may still write into it): the object
    it registered stays alive until the engine deregisters it or closes, never freed under a
    live registration."""
    import gc
    import weakref

    import numpy as np

    eng = hixl.Engine("127.0.0.1:0", {"hixl.Transport": "tcp"})
    arr = np.zeros(1 << 20, dtype=np.uint8)
    alive = weakref.ref(arr)
    region = eng.register(arr)
    del arr, region
    gc.collect()
    assert alive() is not None, "the buffer was freed while still registered"
    kept = eng.register(np.zeros(4096, dtype=np.uint8))
    eng.deregister(kept).wait(5)
    eng.close()
    gc.collect()
    assert alive() is None, "the engine kept the buffer after it closed"
