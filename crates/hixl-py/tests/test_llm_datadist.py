"""hixl.llm_datadist between two real processes over real sockets: this test process is one
cluster, tests/dd_peer.py the other; every block of every flow is checked against the pattern
(seed, tensor, block) both sides fill it with."""

import ctypes
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest

from conftest import sigstop
from dd_util import Peer, blocks_cache, digest, filled, local, value
from hixl.llm_datadist import (BlockFailure, BlocksCacheKey, Cache, CacheDesc, CacheKey,
                               CacheKeyByIdAndIndex, DataType, LayerSynchronizer, LeaseGrant,
                               LLMClusterInfo, LLMConfig, LLMDataDist, LLMException, LLMRole,
                               LLMStatusCode, Placement, TransferConfig,
                               TransferWithCacheKeyConfig, kv_shard_readers, kv_shard_sources,
                               plan_token_blocks)

S = LLMStatusCode
L, B, E, SEED = 4, 16, 64, 11


@pytest.fixture(params=["tcp", "fabric"])
def transport(request):
    return request.param


@pytest.fixture
def pair(transport):
    """(peer process as cluster 1, this process's LLMDataDist as cluster 2, linked)."""
    peer = Peer(cluster=1, transport=transport, layers=L, blocks=B, elems=E, seed=SEED)
    dd = local(cluster=2, transport=transport)
    try:
        ret, rets = dd.link_clusters([peer.info()], 5000)
        assert (ret, rets) == (S.LLM_SUCCESS, [S.LLM_SUCCESS])
        yield peer, dd
    finally:
        dd.finalize()
        peer.close()


def expect_blocks(got, seed, pairs, guard, layers_src=None, layers_dst=None, per_layer=2):
    """``got`` (digest of the destination) holds source block s of source tensor ts at dst
    block d of dst tensor td for every pair and layer mapping, and ``guard`` elsewhere."""
    tensors = len(got)
    want = [[guard(t, b) for b in range(len(got[0]))] for t in range(tensors)]
    ls = list(layers_src if layers_src is not None else range(tensors // per_layer))
    ld = list(layers_dst if layers_dst is not None else ls)
    for sl, dl in zip(ls, ld):
        for k in range(per_layer):
            for s, d in pairs:
                want[dl * per_layer + k][d] = value(seed, sl * per_layer + k, s)
    assert got == want


def test_link_transport_names_the_forced_transport(pair, transport):
    peer, dd = pair
    name = dd.link_transport(1)
    assert name.split()[0] == transport and "(" in name, name   # the transport, then why
    with pytest.raises(LLMException) as e:
        dd.link_transport(99)
    assert e.value.status_code == S.LLM_NOT_YET_LINK


def test_pull_blocks_scattered_with_layer_ranges(pair):
    peer, dd = pair
    guard = filled(99, 2 * L, B, E)
    dc = blocks_cache(dd, guard)
    src, dst = [3, 0, 7, 8, 9, 15], [1, 14, 2, 3, 4, 0]
    dd.cache_manager.pull_blocks(BlocksCacheKey(1, 0), dc, src, dst)
    expect_blocks(digest(guard), SEED, list(zip(src, dst)), lambda t, b: value(99, t, b))
    # layers 1..3 of the source into layers 0..2 here, one more block
    dd.cache_manager.pull_blocks(BlocksCacheKey(1, 0), dc, [5], [5],
                                 src_layer_range=range(1, 4), dst_layer_range=range(0, 3))
    got = digest(guard)
    for t in range(2 * L):
        want = value(SEED, t + 2, 5) if t < 6 else value(99, t, 5)
        assert got[t][5] == want, t
    # one tensor per layer (an MLA cache's layout): tensors 5..7 into tensors 1..3
    dd.cache_manager.pull_blocks(BlocksCacheKey(1, 0), dc, [12], [13], tensor_num_per_layer=1,
                                 src_layer_range=range(5, 8), dst_layer_range=range(1, 4))
    got = digest(guard)
    for t in range(2 * L):
        assert got[t][13] == (value(SEED, t + 4, 12) if 1 <= t < 4 else value(99, t, 13)), t


def test_push_blocks_and_caches_by_key_and_index(pair):
    peer, dd = pair
    mine = filled(21, 2 * L, B, E)
    sc = blocks_cache(dd, mine)
    dd.cache_manager.push_blocks(BlocksCacheKey(1, 1), sc, [0, 1, 2, 9], [15, 4, 5, 6])
    expect_blocks(peer.digest("recv"), 21, [(0, 15), (1, 4), (2, 5), (9, 6)], lambda t, b: 0.0)

    # contiguous caches: pull by CacheKey and by id and index, push by id and index
    cont = [np.zeros((4, E), np.float32) for _ in range(2 * L)]
    desc = CacheDesc(2 * L, [4, E], DataType.DT_FLOAT, placement=Placement.HOST)
    cc = dd.cache_manager.register_cache(desc, [a.ctypes.data for a in cont])
    dd.cache_manager.pull_cache(CacheKey(1, 102), cc, batch_index=0)
    dd.cache_manager.pull_cache(CacheKeyByIdAndIndex(1, peer.ids["cont"], 3), cc, 1)
    dd.cache_manager.pull_cache(CacheKey(1, 100), cc, 2, src_layer_range=range(2, 4),
                                dst_layer_range=range(0, 2))
    got = digest(cont)
    for t in range(2 * L):
        assert got[t][0] == value(SEED + 1, t, 2)
        assert got[t][1] == value(SEED + 1, t, 3)
        assert got[t][2] == (value(SEED + 1, t + 4, 0) if t < 4 else 0.0)
        assert got[t][3] == 0.0
    for a in cont:
        for b in range(4):
            a[b] = 7000.0 + b
    dd.cache_manager.push_cache(CacheKeyByIdAndIndex(1, peer.ids["cont_recv"], 2), cc,
                                src_batch_index=1)
    assert peer.digest("cont_recv") == [[0.0, 0.0, 7001.0, 0.0]] * (2 * L)
    # hixl extension: push by CacheKey (the peer's keyed entry: req 103 is entry 3)
    dd.cache_manager.push_cache(CacheKey(1, 103), cc, src_batch_index=2)
    assert [row[3] for row in peer.digest("cont")] == [7002.0] * (2 * L)
    assert [row[0] for row in peer.digest("cont")] == [value(SEED + 1, t, 0) for t in range(2 * L)]

    # a removed key is not pulled again
    assert peer.ask(op="remove_key", req=101) == {"ok": True}
    with pytest.raises(LLMException) as e:
        dd.cache_manager.pull_cache(CacheKey(1, 101), cc, 0)
    assert e.value.status_code == S.LLM_KV_CACHE_NOT_EXIST


class Recorder(LayerSynchronizer):
    def __init__(self, delay=0.0, refuse=None):
        self.calls, self.delay, self.refuse = [], delay, refuse
        self.thread = None

    def synchronize_layer(self, layer_index, timeout_in_millis):
        self.calls.append((layer_index, timeout_in_millis))
        self.thread = threading.current_thread()
        time.sleep(self.delay)
        return layer_index != self.refuse


def test_layerwise_transfer_cache_async(pair):
    peer, dd = pair
    mine = filled(31, 2 * L, B, E)
    sc = blocks_cache(dd, mine)
    sync = Recorder(delay=0.02)
    cfg = TransferWithCacheKeyConfig(BlocksCacheKey(1, 1), range(0, L), range(0, L))
    task = dd.cache_manager.transfer_cache_async(sc, sync, [cfg], [2, 3, 4, 11], [0, 1, 9, 10])
    assert task.synchronize(10000) == S.LLM_SUCCESS
    assert task.get_results() == [S.LLM_SUCCESS]
    assert sync.calls == [(layer, None) for layer in range(L)]
    assert sync.thread is not threading.main_thread()
    expect_blocks(peer.digest("recv"), 31, [(2, 0), (3, 1), (4, 9), (11, 10)], lambda t, b: 0.0)

    # layers 1..2 into layers 2..3 (by id), and a contiguous destination by address
    sync = Recorder()
    by_id = TransferWithCacheKeyConfig(CacheKeyByIdAndIndex(1, peer.ids["recv"]), range(1, 3),
                                       range(2, 4))
    task = dd.cache_manager.transfer_cache_async(sc, sync, [by_id], [6], [6])
    assert task.get_results(10000) == [S.LLM_SUCCESS]
    assert sync.calls == [(1, None), (2, None)]
    got = peer.digest("recv")
    for t in range(2 * L):
        assert got[t][6] == (value(31, t - 2, 6) if t >= 4 else 0.0), t

    sync = Recorder()
    cfg = TransferConfig(1, peer.addrs["recv"])  # by address, every layer
    task = dd.cache_manager.transfer_cache_async(sc, sync, [cfg], [12, 13], [12, 14])
    assert task.synchronize(10000) == S.LLM_SUCCESS
    got = peer.digest("recv")
    for t in range(2 * L):
        assert (got[t][12], got[t][14]) == (value(31, t, 12), value(31, t, 13))

    cont = filled(41, 2 * L, 4, E)
    desc = CacheDesc(2 * L, [4, E], DataType.DT_FLOAT, placement=Placement.HOST)
    cc = dd.cache_manager.register_cache(desc, [a.ctypes.data for a in cont])
    entry = E * 4  # bytes of one batch entry
    dst = [a + 3 * entry for a in peer.addrs["cont_recv"][2:]]  # layers 1.. at entry 3
    cfg = TransferConfig(1, dst, range(0, L - 1), src_batch_index=2)
    task = dd.cache_manager.transfer_cache_async(cc, Recorder(), [cfg])
    assert task.synchronize() == S.LLM_SUCCESS
    got = peer.digest("cont_recv")
    for t in range(2 * L):
        assert got[t][3] == (value(41, t - 2, 2) if t >= 2 else 0.0), t
        assert got[t][:3] == [0.0, 0.0, 0.0]


def test_layerwise_refused_layer_and_timeout(pair):
    peer, dd = pair
    mine = filled(51, 2 * L, B, E)  # referenced while registered
    sc = blocks_cache(dd, mine)
    cfg = TransferWithCacheKeyConfig(BlocksCacheKey(1, 1), range(0, L), range(0, L))
    task = dd.cache_manager.transfer_cache_async(sc, Recorder(refuse=2), [cfg], [1], [1])
    assert task.get_results(10000) == [S.LLM_PARAM_INVALID]
    assert task.get_errors()[0].status_code == S.LLM_PARAM_INVALID
    got = peer.digest("recv")
    assert [got[t][1] for t in range(2 * L)] == [value(51, t, 1) for t in range(4)] + [0.0] * 4
    slow = dd.cache_manager.transfer_cache_async(sc, Recorder(delay=0.3), [cfg], [2], [2])
    assert slow.synchronize(100) == S.LLM_TIMEOUT
    assert slow.get_results(50) == [S.LLM_TIMEOUT]
    assert slow.synchronize() == S.LLM_SUCCESS


def test_leases_end_refuses_and_moves_nothing(transport):
    peer = Peer(cluster=1, transport=transport, layers=2, blocks=B, elems=E, seed=SEED)
    dd = local(cluster=2, transport=transport)
    try:
        assert dd.link_clusters([peer.info()], 5000)[0] == S.LLM_SUCCESS
        guard = filled(98, 4, B, E)
        dc = blocks_cache(dd, guard)
        g = peer.ask(op="lease", request=7, blocks=[2, 3, 4])["grant"]
        grant = LeaseGrant.from_dict(g)
        assert grant.request_id == 7 and grant.blocks == [2, 3, 4]
        dd.cache_manager.pull_leased_blocks(g, BlocksCacheKey(1, 0), dc, dst_blocks=[10, 11, 12])
        expect_blocks(digest(guard), SEED, [(2, 10), (3, 11), (4, 12)],
                      lambda t, b: value(98, t, b))
        # the same blocks cannot be leased twice
        assert peer.ask(op="lease", request=8, blocks=[4, 5])["error"] == "LLM_LEASE_HELD"
        assert peer.ask(op="live") == {"live": 1}
        # the owner revokes the lease: the next pull is refused and moves nothing
        assert peer.ask(op="end_lease", lease=grant.lease_id) == {"ok": True}
        before = digest(guard)
        with pytest.raises(LLMException) as e:
            dd.cache_manager.pull_leased_blocks(grant.to_json(), BlocksCacheKey(1, 0), dc,
                                                [2], [0])
        assert e.value.status_code == S.LLM_LEASE_ENDED
        assert e.value.failed_blocks == []
        assert digest(guard) == before
        ev = peer.ask(op="events", timeout_ms=2000)["events"]
        assert ev == [[7, grant.lease_id, [peer.ids["src"]], [2, 3, 4], "REVOKED"]]
        # a pull with done=True ends its lease DONE
        g2 = LeaseGrant.from_dict(peer.ask(op="lease", request=9, blocks=[6])["grant"])
        dd.cache_manager.renew_lease(g2)
        dd.cache_manager.pull_leased_blocks(g2, BlocksCacheKey(1, 0), dc, done=True)
        assert digest(guard)[0][6] == value(SEED, 0, 6)
        ev = peer.ask(op="events", timeout_ms=2000)["events"]
        assert ev == [[9, g2.lease_id, [peer.ids["src"]], [6], "DONE"]]
        with pytest.raises(LLMException) as e:
            dd.cache_manager.lease_done(g2)
        assert e.value.status_code == S.LLM_LEASE_ENDED
    finally:
        dd.finalize()
        peer.close()


def test_a_minted_grant_is_refused_until_the_owner_leases_it(pair):
    # hixl.vllm's scheduler mints a grant before its worker creates the lease: a pull that
    # comes first is refused and moves nothing; once the lease exists it lands.
    peer, dd = pair
    guard = filled(96, 2 * L, B, E)
    dc = blocks_cache(dd, guard)
    minted = {"owner": 1, "lease_id": 1 << 40, "generation": 0x5EED, "request_id": 11,
              "caches": [peer.ids["src"]], "blocks": [3, 4], "ttl_ms": 30000}
    before = digest(guard)
    with pytest.raises(LLMException) as e:
        dd.cache_manager.pull_leased_blocks(minted, BlocksCacheKey(1, 0), dc, dst_blocks=[0, 1])
    assert e.value.status_code == S.LLM_LEASE_ENDED and e.value.failed_blocks == []
    assert digest(guard) == before
    g = peer.ask(op="lease", request=11, blocks=[3, 4], lease_id=1 << 40,
                 generation=0x5EED)["grant"]
    assert g == minted
    # the same id again, or half a minted pair, is refused
    assert peer.ask(op="lease", request=12, blocks=[5], lease_id=1 << 40,
                    generation=7)["error"] == "LLM_PARAM_INVALID"
    assert "go together" in peer.ask(op="lease", request=12, blocks=[5], lease_id=5)["message"]
    dd.cache_manager.pull_leased_blocks(minted, BlocksCacheKey(1, 0), dc, dst_blocks=[0, 1],
                                        done=True)
    expect_blocks(digest(guard), SEED, [(3, 0), (4, 1)], lambda t, b: value(96, t, b))
    ev = peer.ask(op="events", timeout_ms=2000)["events"]
    assert ev == [[11, 1 << 40, [peer.ids["src"]], [3, 4], "DONE"]]


def test_failed_blocks_after_the_peer_unregisters(pair):
    peer, dd = pair
    guard = filled(97, 2 * L, B, E)
    dc = blocks_cache(dd, guard)
    assert peer.ask(op="unregister", cache="src") == {"ok": True}
    src, dst = [1, 2, 3, 9], [0, 1, 2, 8]
    with pytest.raises(LLMException) as e:
        dd.cache_manager.pull_blocks(BlocksCacheKey(1, 0), dc, src, dst)
    want = sorted(BlockFailure(layer, layer, s, d) for layer in range(L) for s, d in zip(src, dst))
    assert e.value.failed_blocks == want, str(e.value)
    assert e.value.status_code != S.LLM_SUCCESS
    assert digest(guard) == digest(filled(97, 2 * L, B, E))
    # a layer-wise push into an unregistered cache: its errors list what did not land
    assert peer.ask(op="unregister", cache="recv") == {"ok": True}
    cfg = TransferWithCacheKeyConfig(BlocksCacheKey(1, 1), range(0, L), range(0, L))
    task = dd.cache_manager.transfer_cache_async(dc, Recorder(), [cfg], [4, 5], [6, 9])
    [r] = task.get_results(10000)
    assert r not in (None, S.LLM_SUCCESS)
    [err] = task.get_errors()
    assert err.status_code == r and err.failed_blocks
    layers = {f.src_layer for f in err.failed_blocks}
    assert err.failed_blocks == sorted(BlockFailure(layer, layer, s, d) for layer in layers
                                       for s, d in ((4, 6), (5, 9)))


def test_failed_blocks_when_the_peer_dies_mid_pull():
    # 16 layers x 32 blocks x 256 KiB; the peer is killed as soon as bytes start landing
    layers, blocks, elems = 16, 32, 64 * 1024
    peer = Peer(cluster=1, transport="tcp", layers=layers, blocks=blocks, elems=elems, seed=3)
    dd = local(cluster=2, transport="tcp", sync_ms=20000)
    try:
        assert dd.link_clusters([peer.info()], 5000)[0] == S.LLM_SUCCESS
        dst = [np.zeros((blocks, elems), np.float32) for _ in range(2 * layers)]
        dc = blocks_cache(dd, dst)
        def kill_once_bytes_land():
            # the first landed block (every block holds nonzero values) ends the peer
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any(a[:, 0].any() for a in dst):
                time.sleep(0.0005)
            peer.proc.kill()

        killer = threading.Thread(target=kill_once_bytes_land)
        killer.start()
        try:
            dd.cache_manager.pull_blocks(BlocksCacheKey(1, 0), dc, list(range(blocks)),
                                         list(range(blocks)))
            pytest.skip("the pull finished before the kill")
        except LLMException as e:
            failed = set(e.failed_blocks)
            assert failed, str(e)
            got = digest(dst)
            for layer in range(layers):
                for b in range(blocks):
                    if BlockFailure(layer, layer, b, b) in failed:
                        continue
                    for k in range(2):
                        t = 2 * layer + k
                        assert got[t][b] == value(3, t, b), (t, b)
        finally:
            killer.join()
    finally:
        dd.finalize()
        peer.close()


def test_resharded_pull_from_two_prefill_ranks():
    heads, tokens, head_dim = 4, 2, 8
    peer = Peer(cluster=1, transport="tcp", layers=2, blocks=4, elems=8, seed=1)
    try:
        ids = peer.ask(op="shards", tp=2, heads=heads, tokens=tokens, head_dim=head_dim)["ids"]
        assert set(ids) == {"tp0", "tp1"}
        dd = local(cluster=2)
        try:
            assert dd.link_clusters([peer.info()], 5000)[0] == S.LLM_SUCCESS
            dst = [np.zeros((4, tokens, heads, head_dim), np.float32) for _ in range(4)]
            desc = CacheDesc(4, [4, tokens, heads, head_dim], DataType.DT_FLOAT,
                             placement=Placement.HOST)
            dc = dd.cache_manager.register_blocks_cache(desc, [a.ctypes.data for a in dst])
            dd.cache_manager.set_kv_shard(dc, 0, 1, heads, head_dim, "NHD")
            dd.cache_manager.pull_kv_blocks_resharded(
                [BlocksCacheKey(1, 10), BlocksCacheKey(1, 11)], dc, [1, 3], [0, 2])
            for t, a in enumerate(dst):
                for d, s in ((0, 1), (2, 3)):
                    for h in range(heads):
                        for tok in range(tokens):
                            want = h * 100 + tok * 10 + t + s * 10000
                            assert (a[d, tok, h] == want).all(), (t, d, h, tok)
                for d in (1, 3):
                    assert (a[d] == 0).all()
        finally:
            dd.finalize()
    finally:
        peer.close()


def test_token_pull_between_block_sizes_and_tp_sizes():
    # The peer process's two TP ranks hold blocks of 2 tokens; this decode of TP 1 holds
    # blocks of 4: decode block 2 (position 0) takes tokens 0..4 from prefill blocks 1 and 3.
    heads, tokens, head_dim = 4, 2, 8
    assert plan_token_blocks([1, 3, None], [2, None, 0], 6, 2, 4) == ([2], [0])
    with pytest.raises(LLMException) as e:
        plan_token_blocks([1], [2, 2], 8, 2, 4)
    assert "destination block 2 is given at positions 0 and 1" in str(e.value)
    peer = Peer(cluster=1, transport="tcp", layers=2, blocks=4, elems=8, seed=1)
    try:
        peer.ask(op="shards", tp=2, heads=heads, tokens=tokens, head_dim=head_dim)
        dd = local(cluster=2)
        try:
            assert dd.link_clusters([peer.info()], 5000)[0] == S.LLM_SUCCESS
            rows = 2 * tokens
            dst = [np.zeros((4, rows, heads, head_dim), np.float32) for _ in range(4)]
            desc = CacheDesc(4, [4, rows, heads, head_dim], DataType.DT_FLOAT,
                             placement=Placement.HOST)
            dc = dd.cache_manager.register_blocks_cache(desc, [a.ctypes.data for a in dst])
            dd.cache_manager.set_kv_shard(dc, 0, 1, heads, head_dim, "NHD")
            dd.cache_manager.pull_kv_tokens([BlocksCacheKey(1, 10), BlocksCacheKey(1, 11)], dc,
                                            [1, 3], [2], 4)
            for t, a in enumerate(dst):
                for r in range(rows):
                    s = (1, 3)[r // tokens]
                    for h in range(heads):
                        want = h * 100 + (r % tokens) * 10 + t + s * 10000
                        assert (a[2, r, h] == want).all(), (t, r, h)
                for d in (0, 1, 3):
                    assert (a[d] == 0).all()
        finally:
            dd.finalize()
    finally:
        peer.close()


def test_leased_resharded_pull_by_two_decode_ranks_from_one_prefill_rank():
    # P_TP=1, D_TP=2: both decode ranks (two clusters, two links) read the one prefill rank's
    # lease; it ends DONE only once both pulled with done.
    heads, tokens, head_dim = 4, 2, 8
    assert kv_shard_readers(2, 1, heads) == [2]
    assert kv_shard_sources(1, 2, 1, heads) == [0]
    assert kv_shard_readers(2, 4, 2) == [1, 0, 0, 1]
    assert kv_shard_sources(1, 2, 4, 2) == [3]
    assert kv_shard_readers(4, 2, 1, mla=True) == [2, 2]
    for bad in (lambda: kv_shard_readers(0, 1, 4), lambda: kv_shard_readers(2, "1", 4),
                lambda: kv_shard_sources(2, 2, 1, 4), lambda: kv_shard_readers(2, 3, 4),
                lambda: kv_shard_readers(2, 1, 4, mla=1)):
        with pytest.raises(LLMException) as e:
            bad()
        assert e.value.status_code == S.LLM_PARAM_INVALID
    with pytest.raises(LLMException, match="prefill_tp"):
        kv_shard_readers(2, -1, 4)
    with pytest.raises(LLMException, match="do not divide"):
        kv_shard_sources(0, 2, 3, 4)
    peer = Peer(cluster=1, transport="tcp", layers=2, blocks=4, elems=8, seed=1)
    decode = []
    try:
        ids = peer.ask(op="shards", tp=1, heads=heads, tokens=tokens, head_dim=head_dim)["ids"]
        assert set(ids) == {"tp0"}
        g = peer.ask(op="lease", request=5, caches=["tp0"], blocks=[1, 3])["grant"]
        key = BlocksCacheKey(1, 10)
        for rank in range(2):
            dd = local(cluster=2 + rank)
            decode.append(dd)
            assert dd.link_clusters([peer.info()], 5000)[0] == S.LLM_SUCCESS
            hn = heads // 2
            dst = [np.zeros((4, tokens, hn, head_dim), np.float32) for _ in range(4)]
            desc = CacheDesc(4, [4, tokens, hn, head_dim], DataType.DT_FLOAT,
                             placement=Placement.HOST)
            dc = dd.cache_manager.register_blocks_cache(desc, [a.ctypes.data for a in dst])
            dd.cache_manager.set_kv_shard(dc, rank, 2, heads, head_dim, "NHD")
            if rank == 0:
                # a wrong generation: refused, nothing moves
                stale = dict(g, generation=g["generation"] ^ 1)
                with pytest.raises(LLMException) as e:
                    dd.cache_manager.pull_leased_blocks_resharded([stale], [key], dc, [1, 3],
                                                                  [0, 2])
                assert e.value.status_code == S.LLM_LEASE_ENDED
                assert all((a == 0).all() for a in dst)
                with pytest.raises(LLMException, match="grants must be a list"):
                    dd.cache_manager.pull_leased_blocks_resharded(g, [key], dc, [1], [0])
            dd.cache_manager.pull_leased_blocks_resharded([g], [key], dc, [1, 3], [0, 2])
            for t, a in enumerate(dst):
                for d, s in ((0, 1), (2, 3)):
                    for h in range(hn):
                        for tok in range(tokens):
                            want = (rank * hn + h) * 100 + tok * 10 + t + s * 10000
                            assert (a[d, tok, h] == want).all(), (rank, t, d, h, tok)
                for d in (1, 3):
                    assert (a[d] == 0).all()
            if rank == 0:
                # The pull's done is not waited for; an answered done (the same link's, counted
                # once) is: after it, one reader of two is done and the lease lives on.
                dd.cache_manager.lease_done(g)
                assert peer.ask(op="events")["events"] == []
                assert peer.ask(op="live") == {"live": 1}
        ev = peer.ask(op="events", timeout_ms=5000)["events"]
        assert ev == [[5, g["lease_id"], [ids["tp0"]], [1, 3], "DONE"]]
        assert peer.ask(op="live") == {"live": 0}
    finally:
        for dd in decode:
            dd.finalize()
        peer.close()


def test_errors_are_llm_exceptions_with_their_codes():
    peer = Peer(cluster=1, transport="tcp", layers=1, blocks=4, elems=8, seed=2, sync_ms=300)
    dd = local(cluster=2, transport="tcp", sync_ms=300)
    try:
        cm = dd.cache_manager
        arrs = filled(5, 2, 4, 8)
        dc = blocks_cache(dd, arrs)

        def code(f, *a, **kw):
            with pytest.raises(LLMException) as e:
                f(*a, **kw)
            return e.value.status_code

        # not linked yet
        assert code(cm.pull_blocks, BlocksCacheKey(1, 0), dc, [0], [0]) == S.LLM_NOT_YET_LINK
        assert code(cm.push_blocks, BlocksCacheKey(9, 0), dc, [0], [0]) == S.LLM_NOT_YET_LINK
        assert dd.unlink_clusters([peer.info()])[1] == [S.LLM_NOT_YET_LINK]
        # the address is another cluster's
        assert dd.link_clusters([peer.info(cluster=5)], 2000)[1] == [S.LLM_LINK_FAILED]
        # link, link twice, too many clusters, nobody listening
        assert dd.link_clusters([peer.info()]) == (S.LLM_SUCCESS, [S.LLM_SUCCESS])
        assert dd.link_clusters([peer.info()]) == (S.LLM_ALREADY_LINK, [S.LLM_ALREADY_LINK])
        many = [peer.info(cluster=100 + i) for i in range(17)]
        assert dd.link_clusters(many)[0] == S.LLM_CLUSTER_NUM_EXCEED_LIMIT
        assert dd.unlink_clusters(many)[0] == S.LLM_CLUSTER_NUM_EXCEED_LIMIT
        closed = LLMClusterInfo()
        closed.remote_cluster_id = 6
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed.append_remote_ip_info("127.0.0.1", s.getsockname()[1])
        assert dd.link_clusters([closed], 2000)[1] == [S.LLM_LINK_FAILED]
        # a listener that never answers: the link times out
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(4)
            mute = LLMClusterInfo()
            mute.remote_cluster_id = 7
            mute.append_remote_ip_info("127.0.0.1", silent.getsockname()[1])
            t0 = time.monotonic()
            assert dd.link_clusters([mute], 300)[1] == [S.LLM_TIMEOUT]
            assert time.monotonic() - t0 < 3
        # switch_role with links
        assert code(dd.switch_role, LLMRole.MIX) == S.LLM_EXIST_LINK
        # bad arguments
        assert code(cm.pull_blocks, BlocksCacheKey(1, 0), dc, [0, 4], [0, 1]) == \
            S.LLM_PARAM_INVALID
        assert code(cm.pull_blocks, BlocksCacheKey(1, 0), dc, [0], [9]) == S.LLM_PARAM_INVALID
        assert code(cm.pull_blocks, BlocksCacheKey(1, 0), dc, [0, 1], [0]) == \
            S.LLM_PARAM_INVALID
        assert code(cm.pull_blocks, BlocksCacheKey(1, 7), dc, [0], [0]) == \
            S.LLM_KV_CACHE_NOT_EXIST
        assert code(cm.pull_blocks, BlocksCacheKey(1, 0), dc, [0], [0],
                    src_layer_range=range(0, 3)) == S.LLM_PARAM_INVALID
        with pytest.raises(TypeError):  # also an LLMException with LLM_PARAM_INVALID
            cm.pull_blocks(BlocksCacheKey(1, 0), dc, [0], [0], layers=3)
        with pytest.raises(ValueError) as e:
            cm.pull_blocks(BlocksCacheKey(1, 0), dc, [-1], [0])
        assert e.value.status_code == S.LLM_PARAM_INVALID and "-1" in str(e.value)
        big = CacheDesc(241, [4, 8], DataType.DT_FLOAT, placement=Placement.HOST)
        assert code(cm.register_blocks_cache, big, [arrs[0].ctypes.data] * 241) == \
            S.LLM_PARAM_INVALID
        dev = CacheDesc(2, [4, 8], DataType.DT_FLOAT)
        with pytest.raises(LLMException) as e:
            cm.register_blocks_cache(dev, [a.ctypes.data for a in arrs])
        assert e.value.status_code == S.LLM_FEATURE_NOT_ENABLED
        assert "Placement.DEVICE" in str(e.value) and "device runtime" in str(e.value)
        assert code(cm.register_blocks_cache, CacheDesc(1, [4, 8], DataType.DT_FLOAT,
                    placement=Placement.HOST), [4096]) == S.LLM_PARAM_INVALID
        small = CacheDesc(1, [4, 8], DataType.DT_FLOAT, placement=Placement.HOST)
        assert code(cm.register_blocks_cache, small, [np.zeros(8, np.float32)]) == \
            S.LLM_PARAM_INVALID  # 32 bytes for a 128-byte tensor
        assert code(cm.register_blocks_cache, small, [np.zeros((8, 8), np.float32)[:, ::2]]) == \
            S.LLM_PARAM_INVALID  # not contiguous
        assert code(cm.register_blocks_cache, small, ["0x1000"]) == S.LLM_PARAM_INVALID
        assert code(cm.register_blocks_cache, CacheDesc(2, [4, 8], DataType.DT_FLOAT,
                    placement=Placement.HOST), [a.ctypes.data for a in arrs],
                    BlocksCacheKey(2, 0)) == S.LLM_PARAM_INVALID  # the key is in use
        with pytest.raises(LLMException) as e:  # the memory is cache dc's
            cm.register_blocks_cache(CacheDesc(1, [2, 8], DataType.DT_FLOAT,
                                               placement=Placement.HOST),
                                     [arrs[1].ctypes.data + 32])
        assert e.value.status_code == S.LLM_PARAM_INVALID and "overlaps" in str(e.value)
        # a transfer past sync_kv_timeout: the peer is stopped
        sigstop(peer.proc.pid)
        try:
            t0 = time.monotonic()
            assert code(cm.pull_blocks, BlocksCacheKey(1, 0), dc, [0], [0]) == S.LLM_TIMEOUT
            assert time.monotonic() - t0 < 5
        finally:
            os.kill(peer.proc.pid, signal.SIGCONT)
        # unlink, then switch_role is allowed
        assert dd.unlink_clusters([peer.info()], 3000, force=True)[0] == S.LLM_SUCCESS
        dd.switch_role(LLMRole.MIX)
        assert dd.role == LLMRole.MIX
        # unknown option; calls before init and after finalize
        fresh = LLMDataDist(LLMRole.PROMPT, 3)
        assert code(fresh.init, {"llm.listenIpInfo": "127.0.0.1:0", "llm.Nope": "1"}) == \
            S.LLM_PARAM_INVALID
        assert code(fresh.link_clusters, [peer.info()]) == S.LLM_FAILED
        with pytest.raises(LLMException) as e:  # the port is the peer's
            fresh.init({"llm.listenIpInfo": peer.addr})
        assert peer.addr in str(e.value)
        assert code(fresh.init, {}) == S.LLM_PARAM_INVALID  # no listen address
        assert code(fresh.init, {"llm.listenIpInfo": "127.0.0.1:0",
                                 "hixl.Transport": "pigeon"}) == S.LLM_PARAM_INVALID
        with pytest.raises(LLMException) as e:
            fresh.cache_manager
        assert e.value.status_code == S.LLM_FAILED and "not initialized" in str(e.value)
    finally:
        dd.finalize()
        peer.close()
    assert code(cm.pull_blocks, BlocksCacheKey(1, 0), dc, [0], [0]) == S.LLM_ENGINE_FINALIZED
    assert code(dd.link_clusters, [peer.info()]) == S.LLM_FAILED


def test_a_peer_that_does_not_finalize_exits_promptly():
    peer = Peer(cluster=1, transport="tcp", layers=1, blocks=4, elems=8, seed=2)
    dd = local(cluster=2)
    try:
        assert dd.link_clusters([peer.info()])[0] == S.LLM_SUCCESS
        assert peer.ask(op="link", cluster=2, addr=dd.listen_ip_info)["ret"] == "LLM_SUCCESS"
        t0 = time.monotonic()
        peer.proc.stdin.write(b'{"op": "exit", "finalize": false}\n')
        peer.proc.stdin.flush()
        assert peer.proc.wait(10) == 0
        assert time.monotonic() - t0 < 5
    finally:
        dd.finalize()
        peer.close()


def test_concurrent_pulls_release_the_gil():
    peer = Peer(cluster=1, transport="tcp", layers=L, blocks=B, elems=E, seed=SEED, sync_ms=1500)
    dd = local(cluster=2, transport="tcp", sync_ms=1500)
    try:
        assert dd.link_clusters([peer.info()])[0] == S.LLM_SUCCESS
        guard = filled(96, 2 * L, B, E)
        dc = blocks_cache(dd, guard)
        errors = []

        def pull(blocks):
            try:
                for _ in range(5):
                    dd.cache_manager.pull_blocks(BlocksCacheKey(1, 0), dc, blocks, blocks)
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=pull, args=([b, b + 4],)) for b in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        expect_blocks(digest(guard), SEED, [(b, b) for b in range(8)],
                      lambda t, b: value(96, t, b))
        # while a pull waits on a stopped peer, this thread keeps running Python
        sigstop(peer.proc.pid)
        try:
            waiting = threading.Thread(target=pull, args=([9],))
            waiting.start()
            time.sleep(0.05)
            n, t0 = 0, time.monotonic()
            while time.monotonic() - t0 < 0.3:
                n += 1
            assert waiting.is_alive(), f"the pull ended early: {errors}"
            assert n > 1000  # with the GIL held by the pull, this loop could not run
            waiting.join()
            assert [e.status_code for e in errors] == [S.LLM_TIMEOUT]
        finally:
            os.kill(peer.proc.pid, signal.SIGCONT)
    finally:
        dd.finalize()
        peer.close()


def test_local_copy_and_swap_blocks():
    dd = local(cluster=2)
    try:
        cm = dd.cache_manager
        a = filled(61, 2, 8, 16)
        ca = blocks_cache(dd, a)
        cm.copy_blocks(ca, {1: [4, 5], 2: [6]})
        got = digest(a)
        for t in range(2):
            assert got[t] == [value(61, t, b) for b in (0, 1, 2, 3, 1, 1, 2, 7)]
        with pytest.raises(LLMException) as e:
            cm.copy_blocks(ca, {1: [8]})
        assert e.value.status_code == S.LLM_PARAM_INVALID
        b = [np.zeros((8, 16), np.float32) for _ in range(2)]
        cb = blocks_cache(dd, b, model_id=1)
        cm.swap_blocks(ca, cb, {0: 7, 3: 2})
        host = [np.zeros((8, 16), np.float32) for _ in range(2)]
        cpu = Cache.create_cpu_cache(CacheDesc(2, [8, 16], DataType.DT_FLOAT,
                                               placement=Placement.HOST),
                                     [h.ctypes.data for h in host])
        cm.swap_blocks(cb, cpu, {7: 0, 2: 1})
        for t in range(2):
            assert digest(b)[t] == [0.0, 0.0, value(61, t, 3), 0, 0, 0, 0, value(61, t, 0)]
            assert digest(host)[t] == [value(61, t, 0), value(61, t, 3)] + [0.0] * 6
        with pytest.raises(LLMException) as e:
            cm.swap_blocks(cb, cpu, {9: 0})
        assert e.value.status_code == S.LLM_PARAM_INVALID
        bogus = Cache.create_cpu_cache(CacheDesc(2, [8, 16], DataType.DT_FLOAT,
                                                 placement=Placement.HOST), [4096, 8192])
        with pytest.raises(LLMException) as e:
            cm.swap_blocks(cb, bogus, {0: 0})
        assert e.value.status_code == S.LLM_PARAM_INVALID and "not mapped" in str(e.value)
    finally:
        dd.finalize()


def test_llm_config_generates_llm_datadist_option_keys():
    c = LLMConfig()
    c.device_id = 3
    c.sync_kv_timeout = 2500
    c.listen_ip_info = "127.0.0.1:26000"
    c.enable_cache_manager = True
    c.enable_remote_cache_accessible = True
    c.local_comm_res = ""
    c.transfer_backend = "hixl"
    c.link_retry_count = 3
    c.ge_options = {"hixl.Transport": "tcp"}
    assert c.generate_options() == {
        "ge.exec.deviceId": "3", "llm.SyncKvCacheWaitTime": "2500",
        "llm.listenIpInfo": "127.0.0.1:26000", "llm.EnableCacheManager": "1",
        "llm.EnableRemoteCacheAccessible": "1", "llm.LocalCommRes": "",
        "llm.TransferBackend": "hixl", "llm.LinkRetryCount": "3", "hixl.Transport": "tcp"}
    with pytest.raises(ValueError) as e:
        c.link_retry_count = 101
    assert isinstance(e.value, LLMException) and "101" in str(e.value)
    with pytest.raises(TypeError):
        c.enable_cache_manager = "yes"
    assert LLMRole.PROMPT == 1 and LLMRole.DECODER == 2 and LLMRole.MIX == 3
    assert S.LLM_LEASE_ENDED == 0x5010B100 and S.LLM_LEASE_HELD == 0x5010B101
    assert S.LLM_PARAM_INVALID == 0x5010B005 and S.LLM_EXIST_LINK == 0x5010B018
    assert CacheKey(1, 2).prefix_id == 2**64 - 1 and BlocksCacheKey(4).model_id == 0
    assert CacheKey(cluster_id=1, req_id=2, model_id=3) == CacheKey(1, 2, 3)
    assert BlocksCacheKey(cluster_id=4, model_id=1) == BlocksCacheKey(4, 1)
    with pytest.raises(TypeError):
        CacheKey(1)
    ci = LLMClusterInfo()
    ci.append_remote_ip_info("10.1.2.3", 26000)
    assert ci.remote_ip_info_list == [(0x0302010A, 26000)]


def test_a_cache_registered_after_link_is_pulled_once_announced(transport):
    peer = Peer(cluster=1, transport=transport, layers=2, blocks=4, elems=8, seed=1)
    dd = local(cluster=2, transport=transport)
    try:
        assert dd.link_clusters([peer.info()])[0] == S.LLM_SUCCESS
        assert set(peer.ask(op="shards", tp=2, heads=4, tokens=2, head_dim=8)["ids"]) == \
            {"tp0", "tp1"}
        dst = [np.zeros((4, 2, 2, 8), np.float32) for _ in range(4)]
        desc = CacheDesc(4, [4, 2, 2, 8], DataType.DT_FLOAT, placement=Placement.HOST)
        dc = dd.cache_manager.register_blocks_cache(desc, [a.ctypes.data for a in dst])
        # the new regions reach the linked peer asynchronously: until then a transfer naming
        # them is refused (LLM_PARAM_INVALID, nothing moved); it goes through after
        deadline = time.monotonic() + 5
        while True:
            try:
                dd.cache_manager.pull_blocks(BlocksCacheKey(1, 11), dc, [1, 2], [0, 3])
                break
            except LLMException as e:
                assert e.status_code == S.LLM_PARAM_INVALID, str(e)
                assert "outside the regions" in str(e) and time.monotonic() < deadline
                time.sleep(0.01)
        for t, a in enumerate(dst):
            for d, s in ((0, 1), (3, 2)):
                for h in range(2):
                    for tok in range(2):
                        assert (a[d, tok, h] == (2 + h) * 100 + tok * 10 + t + s * 10000).all()
            assert (a[1] == 0).all() and (a[2] == 0).all()
    finally:
        dd.finalize()
        peer.close()


def test_allocated_caches_pull_and_push(pair):
    peer, dd = pair
    cm = dd.cache_manager
    desc = CacheDesc(2 * L, [B, E], DataType.DT_FLOAT, placement=Placement.HOST)
    cache = cm.allocate_blocks_cache(desc, BlocksCacheKey(2, 5))
    views = [np.ctypeslib.as_array(ctypes.cast(a, ctypes.POINTER(ctypes.c_float)),
                                   shape=(B, E)) for a in cache.tensor_addrs]
    assert all((v == 0).all() for v in views)
    cm.pull_blocks(BlocksCacheKey(1, 0), cache, [3, 4], [8, 9])
    expect_blocks(digest(views), SEED, [(3, 8), (4, 9)], lambda t, b: 0.0)
    cm.push_blocks(BlocksCacheKey(1, 1), cache, [8], [2])
    got = peer.digest("recv")
    assert [got[t][2] for t in range(2 * L)] == [value(SEED, t, 3) for t in range(2 * L)]
    cm.deallocate_blocks_cache(cache)
    with pytest.raises(LLMException) as e:
        cm.pull_blocks(BlocksCacheKey(1, 0), cache, [3], [8])
    assert e.value.status_code == S.LLM_KV_CACHE_NOT_EXIST


def test_each_layer_is_sent_when_its_synchronizer_returns(pair):
    peer, dd = pair
    # hixl extension: the arrays themselves as addresses; the cache keeps them alive
    desc = CacheDesc(2 * L, [B, E], DataType.DT_FLOAT, placement=Placement.HOST)
    sc = dd.cache_manager.register_blocks_cache(desc, filled(71, 2 * L, B, E))

    class WaitForPrevious(LayerSynchronizer):
        """Layer l is released only once layer l - 1 landed at the peer: each layer goes out
        as soon as its synchronize_layer returns, before the next one is asked for."""

        def __init__(self):
            self.seen = []

        def synchronize_layer(self, layer_index, timeout_in_millis):
            if layer_index > 0:
                deadline = time.monotonic() + 5
                while True:
                    got = peer.digest("recv")
                    prev = [got[2 * (layer_index - 1) + k][15] for k in range(2)]
                    if prev == [value(71, 2 * (layer_index - 1) + k, 0) for k in range(2)]:
                        break
                    assert time.monotonic() < deadline, (layer_index, prev)
                    time.sleep(0.005)
                nxt = got[2 * layer_index][15]
                assert nxt == 0.0, (layer_index, nxt)  # not sent before it was released
            self.seen.append(layer_index)
            return True

    sync = WaitForPrevious()
    cfg = TransferWithCacheKeyConfig(BlocksCacheKey(1, 1), range(0, L), range(0, L))
    task = dd.cache_manager.transfer_cache_async(sc, sync, [cfg], [0], [15])
    assert task.get_results(20000) == [S.LLM_SUCCESS], task.get_errors()
    assert sync.seen == list(range(L))
    got = peer.digest("recv")
    assert [got[t][15] for t in range(2 * L)] == [value(71, t, 0) for t in range(2 * L)]
