"""Region.buffer / Region.numpy: views of pooled (fabric) regions in place, that never outlive
the memory they show."""

import gc

import numpy as np
import pytest

import hixl

KiB = 1 << 10


@pytest.fixture
def engine():
    eng = hixl.Engine("127.0.0.1:0", {"hixl.Transport": "fabric"})
    try:
        yield eng
    finally:
        eng.close()


def test_views_read_and_write_the_region_in_place(engine):
    region = engine.register_pooled(64 * KiB, name="pool")
    mv = region.buffer()
    assert (mv.format, mv.nbytes, mv.readonly) == ("B", 64 * KiB, False)
    mv[0:4] = b"abcd"
    assert region.read(0, 4) == b"abcd"
    region.write(100, b"xyz")
    assert bytes(mv[100:103]) == b"xyz"
    part = region.buffer(4096, 16)
    part[:] = b"\x01" * 16
    assert region.read(4096, 16) == b"\x01" * 16
    a = region.numpy("uint32", shape=(16, 16), offset=8192)
    assert a.shape == (16, 16) and a.dtype == np.uint32 and a.flags.writeable
    a[:] = 7
    assert region.read(8192, 8) == (7).to_bytes(4, "little") * 2
    whole = region.numpy()
    assert whole.dtype == np.uint8 and whole.shape == (64 * KiB,)
    assert bytes(whole[:4]) == b"abcd"


def test_a_peer_write_lands_in_the_view(engine):
    region = engine.register_pooled(64 * KiB, name="pool")
    view = region.numpy(np.uint8)
    other = hixl.Engine("127.0.0.1", {"hixl.Transport": "fabric"})
    try:
        peer = other.connect(engine.local_engine, timeout=5.0).wait()
        assert peer.transport.startswith("fabric"), peer.transport
        src = np.arange(4 * KiB, dtype=np.uint16).view(np.uint8)
        local = other.register(src)
        peer.write(hixl.xfer_descs(local, 0, peer.region("pool"), 1024, src.nbytes)).wait(10)
        assert bytes(view[1024:1024 + src.nbytes]) == src.tobytes()
    finally:
        other.close()


def test_deregistration_waits_for_no_view_and_then_refuses_views(engine):
    region = engine.register_pooled(16 * KiB, name="kv")
    a = region.numpy()
    b = a[10:20]  # a numpy view of the view: it holds the memory too
    del a
    with pytest.raises(BufferError, match="pooled region 'kv' has 1 live view"):
        engine.deregister(region)
    mv = region.buffer(0, 8)
    with pytest.raises(BufferError, match="has 2 live view"):
        region.deregister()
    del b
    mv.release()
    gc.collect()
    region.deregister().wait(5)
    with pytest.raises(hixl.FailedError, match="deregistered"):
        region.buffer()


def test_views_keep_the_memory_after_close_and_none_are_given_after_it():
    eng = hixl.Engine("127.0.0.1:0", {"hixl.Transport": "fabric"})
    region = eng.register_pooled(8 * KiB)
    view = region.numpy("uint64")
    view[:] = 0xABCD
    eng.close()
    # The memory is still mapped: the view reads and writes it.
    assert int(view.sum()) == 0xABCD * 1024
    view[3] = 1
    assert int(view[3]) == 1
    with pytest.raises(hixl.FailedError, match="its engine is closed"):
        region.buffer()
    del view


def test_bad_views_name_the_value(engine):
    region = engine.register_pooled(4 * KiB)
    for args, exc, says in [
        ((4097,), hixl.ParamInvalidError, "offset 4097 is outside"),
        ((-1,), hixl.ParamInvalidError, "offset -1 is outside"),
        ((4000, 97), hixl.ParamInvalidError, "length 97 at offset 4000 runs past"),
        ((0, -5), hixl.ParamInvalidError, "length -5 at offset 0"),
        (("0",), TypeError, "offset must be an int, not str"),
    ]:
        with pytest.raises(exc) as e:
            region.buffer(*args)
        assert says in str(e.value), str(e.value)
    with pytest.raises(hixl.ParamInvalidError, match="not a multiple of float64's 8 bytes"):
        region.numpy("float64", offset=4)
    with pytest.raises(hixl.ParamInvalidError, match="length 8192 at offset 0 runs past"):
        region.numpy("uint8", shape=(2, 4096))
    with pytest.raises(hixl.ParamInvalidError, match="negative"):
        region.numpy("uint8", shape=(-1,))
    assert region.buffer(4096).nbytes == 0
    plain = engine.register(bytearray(4 * KiB))
    with pytest.raises(hixl.ParamInvalidError, match="is not pooled"):
        plain.buffer()
