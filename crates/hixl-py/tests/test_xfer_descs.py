"""hixl.xfer_descs: N×3 descriptor arrays from regions, offsets and lengths, every row checked."""

import numpy as np
import pytest

import hixl

KiB = 1 << 10


@pytest.fixture
def pair():
    """A target engine with a 64 KiB region "kv", and an initiator linked to it over tcp."""
    target = hixl.Engine("127.0.0.1:0", {"hixl.Transport": "tcp"})
    kv = np.zeros(64 * KiB, dtype=np.uint8)
    target.register(kv, name="kv")
    eng = hixl.Engine("127.0.0.1", {"hixl.Transport": "tcp"})
    try:
        peer = eng.connect(target.local_engine, timeout=5.0).wait()
        yield eng, peer, kv
    finally:
        eng.close()
        target.close()


def test_rows_are_local_remote_len_and_move_the_bytes(pair):
    eng, peer, kv = pair
    src = np.arange(16 * KiB, dtype=np.uint8)
    local = eng.register(src)
    remote = peer.region("kv")
    blocks, remote_blocks = np.array([0, 2, 3]), np.array([5, 1, 7])
    d = hixl.xfer_descs(local, blocks * 4096, remote, remote_blocks * 4096, 4096)
    assert d.dtype == np.uint64 and d.shape == (3, 3) and d.flags.c_contiguous
    assert d.tolist() == [[local.addr + b * 4096, remote.addr + r * 4096, 4096]
                          for b, r in zip(blocks.tolist(), remote_blocks.tolist())]
    peer.write(d).wait(10)
    for b, r in zip(blocks, remote_blocks):
        assert bytes(kv[r * 4096:(r + 1) * 4096]) == bytes(src[b * 4096:(b + 1) * 4096])
    # and back, by the engine with the same array
    back = eng.register(bytearray(16 * KiB))
    eng.transfer(peer.name, hixl.TransferOp.READ,
                 hixl.xfer_descs(back, [0], remote, [5 * 4096], [4096])).wait(10)
    assert bytes(back.obj[:4096]) == bytes(src[:4096])


def test_broadcasting_lists_of_regions_and_scalars(pair):
    eng, peer, _ = pair
    layers = [eng.register(bytearray(8 * KiB)) for _ in range(3)]
    remote = peer.region("kv")
    d = hixl.xfer_descs(layers, 1024, remote, [0, 8192, 16384], [512, 1024, 2048])
    assert d.tolist() == [[layers[0].addr + 1024, remote.addr, 512],
                          [layers[1].addr + 1024, remote.addr + 8192, 1024],
                          [layers[2].addr + 1024, remote.addr + 16384, 2048]]
    # all scalars: one row; a row that ends exactly at the region's end is inside
    one = hixl.xfer_descs(layers[0], 8 * KiB - 16, remote, 64 * KiB - 16, 16)
    assert one.tolist() == [[layers[0].addr + 8 * KiB - 16, remote.addr + 64 * KiB - 16, 16]]
    # Python ints, numpy integer scalars and unsigned arrays are all integers
    two = hixl.xfer_descs(layers[1], np.int32(0), remote, np.array([0, 4], dtype=np.uint16), 4)
    assert two[:, 1].tolist() == [remote.addr, remote.addr + 4]
    # a RemoteRegion made by hand (from a peer's table elsewhere) and a local region as the
    # remote side are regions too
    rr = hixl.RemoteRegion(0x10000, 4096, 7, hixl.Access.REMOTE_RW, "x")
    assert hixl.xfer_descs(layers[0], 0, rr, 4095, 1).tolist() == [[layers[0].addr, 0x10FFF, 1]]
    assert hixl.xfer_descs([], [], rr, [], []).shape == (0, 3)


def test_bad_input_names_the_descriptor_and_value(pair):
    eng, peer, _ = pair
    local = eng.register(bytearray(8 * KiB), name="loc")
    remote = peer.region("kv")

    def bad(exc, says, *args):
        with pytest.raises(exc) as e:
            hixl.xfer_descs(*args)
        assert says in str(e.value), str(e.value)
        return e.value

    e = bad(hixl.ParamInvalidError, "descriptor 2: local offset 8000 + length 256 is not "
            "inside the local region", local, [0, 0, 8000], remote, 0, 256)
    assert isinstance(e, ValueError) and e.value == 8000 and "'loc'" in str(e)
    e = bad(hixl.ParamInvalidError, "descriptor 1: remote offset 65536 + length 1",
            local, 0, remote, [0, 64 * KiB], 1)
    bad(hixl.ParamInvalidError, "descriptor 0: remote offset 18446744073709551615",
        local, 0, remote, 2**64 - 1, 1)
    bad(hixl.ParamInvalidError, "lengths is 18446744073709551616: past 2**64-1",
        local, 0, remote, 0, 2**64)
    e = bad(hixl.ParamInvalidError, "descriptor 1 has zero length", local, 0, remote, 0, [4, 0])
    assert e.value == 1
    e = bad(hixl.ParamInvalidError, "local_offsets[1] is -4096: negative",
            local, [0, -4096], remote, 0, 16)
    assert e.value == -4096
    bad(hixl.ParamInvalidError, "the rows do not match: local_offsets 2, remote_offsets 3",
        local, [0, 1], remote, [0, 1, 2], 4)
    bad(hixl.ParamInvalidError, "must be an int or 1-D, not of shape (2, 2)",
        local, np.zeros((2, 2), dtype=np.int64), remote, 0, 4)
    bad(TypeError, "lengths is 4.5, not an int", local, 0, remote, 0, 4.5)
    bad(TypeError, "lengths must be integers, not float64 (e.g. 4.5)",
        local, 0, remote, 0, np.array([4.5, 1.0]))
    bad(TypeError, "local_offsets[1] is '8', not an int", local, [0, "8", 2**70], remote, 0, 4)
    bad(TypeError, "must be integers, not booleans", local, 0, remote, 0, True)
    bad(TypeError, "remote must be a hixl.Region", local, 0, remote.addr, 0, 4)
    bad(TypeError, "local[1] is a int, not a hixl.Region", [local, 5], 0, remote, 0, 4)
    eng.deregister(local).wait(5)
    bad(hixl.ParamInvalidError, "local region", local, 0, remote, 0, 4)
