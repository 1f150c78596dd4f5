"""hixl.vllm's two halves driven the way vLLM drives them, with vLLM's own KV cache classes
(``KVCacheConfig``, ``KVCacheGroupSpec``, ``FullAttentionSpec``, ``SlidingWindowSpec``,
``MLAAttentionSpec``), for the layouts a two-core CPU host cannot serve end to end: prefill
and decode of different tensor-parallel sizes (each rank a real ``_Worker`` with its own hixl
instance, all in this process, linked over real sockets), hybrid models (a full-attention
and a sliding-window group whose layers share tensors, as vLLM lays them out, with null
blocks), MLA (one latent per token, the same on every rank), the CPU backend's heads-first
blocks and the K/V-apart tokens-first blocks of GPU backends; and the compatibility check
refusing a mismatch by name. Every pulled block is compared with what the prefill ranks
hold; every prefill rank's lease must end (vLLM frees the blocks) once the decode has them.

Run with the vLLM venv's Python (tools/vllm-e2e.sh does). Exit status 0 when all hold."""
import logging
import sys
import time
from types import SimpleNamespace

import torch
import vllm.distributed.parallel_state as ps
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        MLAAttentionSpec, SlidingWindowSpec)
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.request import RequestStatus

from hixl.vllm._scheduler import _Scheduler
from hixl.vllm._worker import _Worker
from hixl.vllm._common import _extra
from hixl.vllm._geometry import group_pairs, missing_blocks
from hixl.vllm._stages import layer_runs, uncovered

NB, BS, HD, LATENT = 32, 16, 8, 24


def heads_of(rank, tp, total):
    if tp <= total:
        per = total // tp
        return list(range(rank * per, (rank + 1) * per))
    return [rank * total // tp]


def config(role, tp, total_heads, block_size=BS, model="tiny", extra=None, pp=1):
    kt = SimpleNamespace(kv_role=role, engine_id=f"{role}-engine",
                         kv_connector_extra_config=dict(extra or {}))
    return SimpleNamespace(
        kv_transfer_config=kt,
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=pp),
        cache_config=SimpleNamespace(block_size=block_size),
        model_config=SimpleNamespace(model=model, get_total_num_kv_heads=lambda: total_heads,
                                     get_num_kv_heads=lambda pc: max(1, total_heads // tp)))


def caches(kind, rank, tp, total, ref, block_size=BS):
    """(kv_caches, KVCacheConfig) of one rank; ``ref[name]`` is the whole model's tensor (every
    head), of which a rank holds its heads."""
    hs = heads_of(rank, tp, total)
    kv, groups = {}, []
    if kind == "mla":
        spec = MLAAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=LATENT,
                                dtype=torch.float32)
        for n in ("l0", "l1"):
            kv[n] = ref[n].clone()
        groups.append(KVCacheGroupSpec(["l0", "l1"], spec))
    elif kind == "nhd":  # K and V apart, [2, blocks, tokens, heads, head]
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=len(hs), head_size=HD,
                                 dtype=torch.float32)
        for n in ("l0", "l1"):
            kv[n] = ref[n][:, :, :, hs].contiguous()
        groups.append(KVCacheGroupSpec(["l0", "l1"], spec))
    else:  # vLLM's CPU attention: [blocks, heads, tokens, 2 x head]
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=len(hs), head_size=HD,
                                 dtype=torch.float32)
        raw = {n: ref[n][:, hs].contiguous() for n in ("t0", "t1")}
        if kind == "hybrid":  # a full and a sliding-window layer share each tensor
            swa = SlidingWindowSpec(block_size=block_size, num_kv_heads=len(hs), head_size=HD,
                                    dtype=torch.float32, sliding_window=2 * BS)
            kv = {"full0": raw["t0"], "full1": raw["t1"], "swa0": raw["t0"], "swa1": raw["t1"]}
            groups += [KVCacheGroupSpec(["full0", "full1"], spec),
                       KVCacheGroupSpec(["swa0", "swa1"], swa)]
        else:
            kv = {"l0": raw["t0"], "l1": raw["t1"]}
            groups.append(KVCacheGroupSpec(["l0", "l1"], spec))
    return kv, KVCacheConfig(num_blocks=NB, kv_cache_tensors=[], kv_cache_groups=groups)


def reference(kind, total, bs=BS):
    g = torch.Generator().manual_seed(7)
    if kind == "mla":
        return {n: torch.rand((NB, bs, LATENT), generator=g) for n in ("l0", "l1")}
    if kind == "nhd":
        return {n: torch.rand((2, NB, bs, total, HD), generator=g) for n in ("l0", "l1")}
    return {n: torch.rand((NB, total, bs, 2 * HD), generator=g) for n in ("t0", "t1")}


def stage(kv, kvcfg, s, pp):
    """PP stage ``s`` of ``pp``'s part of a rank's caches: the layers vLLM puts there (an
    even split of the layer indices)."""
    if pp == 1:
        return kv, kvcfg
    idx = sorted({int(n[-1]) for n in kv})
    keep = {i for i in idx if i * pp // len(idx) == s}
    kv = {n: t for n, t in kv.items() if int(n[-1]) in keep}
    groups = [KVCacheGroupSpec([n for n in g.layer_names if n in kv], g.kv_cache_spec)
              for g in kvcfg.kv_cache_groups]
    return kv, KVCacheConfig(num_blocks=NB, kv_cache_tensors=[], kv_cache_groups=groups)


def make_worker(vcfg, kvcfg, rank, kv, pp_rank=0):
    ps.get_tensor_model_parallel_rank = lambda: rank  # what vLLM's parallel state answers
    ps.get_pp_group = lambda: SimpleNamespace(rank_in_group=pp_rank)
    w = _Worker(vcfg, kvcfg, _extra(vcfg))
    w.register(kv)
    return w


def until(what, cond, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r = cond()
        if r:
            return r
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def request_blocks(groups, hits=0):
    """vLLM's ``KVCacheBlocks`` of a decode request: per group, its blocks in position order
    (0: vLLM's null block), the first ``hits`` of the full-attention group a local prefix hit
    (hashed)."""
    out = []
    for g, ids in enumerate(groups):
        blocks = []
        for i, b in enumerate(ids):
            blk = KVCacheBlock(b, is_null=b == 0)
            if g == 0 and i < hits:
                blk._block_hash = b"hit%d" % i  # what a cached block carries
            blocks.append(blk)
        out.append(blocks)
    return KVCacheBlocks(tuple(out))


def token_rows(kind, t, blocks, bs, n, hs=None):
    """Token → its row (every head, or heads ``hs`` of a whole-model tensor) of ``t``, for the
    tokens below ``n`` that ``blocks`` (by position, 0: none) hold at ``bs`` per block."""
    out = {}
    for i, b in enumerate(blocks):
        for r in range(bs if b else 0):
            tok = i * bs + r
            if tok >= n:
                break
            if kind == "mla":
                out[tok] = t[b, r]
            elif kind == "nhd":
                out[tok] = t[:, b, r] if hs is None else t[:, b, r][:, hs]
            else:  # vLLM's CPU attention (vec): per head a K plane [head, tokens], a V plane
                heads, rows, hd = t.shape[1], t.shape[2], t.shape[3] // 2
                flat = t[b].reshape(heads, -1)
                k = flat[:, :hd * rows].reshape(heads, hd, rows)[:, :, r]
                v = flat[:, hd * rows:].reshape(heads, rows, hd)[:, r]
                row = torch.cat([k, v], dim=1)
                out[tok] = row if hs is None else row[hs]
    return out


def case(name, kind, ptp, dtp, total, src_groups, dst_groups, d_block_size=BS,
         expect_refusal=None, hits=0, p_block_size=BS, tokens=None, no_shard=False,
         ppp=1, dpp=1):
    print(f"== {name}: P TP {ptp} -> D TP {dtp}, {kind}, {total} KV heads, blocks of "
          f"{p_block_size} -> {d_block_size}, PP {ppp} -> {dpp}", flush=True)
    pbs, dbs = p_block_size, d_block_size
    ref = reference(kind, total, pbs)
    pcfg = config("kv_producer", ptp, total, block_size=pbs, pp=ppp)
    dcfg = config("kv_consumer", dtp, total, block_size=dbs, pp=dpp)
    pre_kv = {(s, r): stage(*caches(kind, r, ptp, total, ref, pbs), s, ppp)
              for s in range(ppp) for r in range(ptp)}
    pre = [make_worker(pcfg, kvcfg, r, kv, s) for (s, r), (kv, kvcfg) in pre_kv.items()]
    zeros = {k: torch.zeros_like(v) for k, v in reference(kind, total, dbs).items()}
    dec_kv = [stage(*caches(kind, r, dtp, total, zeros, block_size=dbs), s, dpp)
              for s in range(dpp) for r in range(dtp)]
    dec = [make_worker(dcfg, kvcfg, i % dtp, kv, i // dtp)
           for i, (kv, kvcfg) in enumerate(dec_kv)]
    if no_shard:  # what a decode whose cache is moved as bytes (fp8: no KV shard) advertises
        for w in dec:
            w.layout.compat["convert"] = False
    n_tokens = tokens or pbs * len(src_groups[0])
    try:
        psched = _Scheduler(pcfg, _extra(pcfg))
        psched.set_handshake({w: pre[i].handshake() for i, w in enumerate(pre_kv)})
        req = SimpleNamespace(request_id="req-1", kv_transfer_params={"do_remote_decode": True},
                              status=RequestStatus.FINISHED_LENGTH_CAPPED,
                              num_computed_tokens=n_tokens,
                              prompt_token_ids=[0] * n_tokens)
        delay, params = psched.request_finished(req, tuple(src_groups))
        assert delay and params, params
        meta = psched.build_connector_meta()
        for w in pre:
            w.on_meta(meta)
        dsched = _Scheduler(dcfg, _extra(dcfg))
        dreq = SimpleNamespace(request_id="req-1", kv_transfer_params=dict(params),
                               num_computed_tokens=hits * dbs,
                               prompt_token_ids=req.prompt_token_ids)
        blocks = request_blocks(dst_groups, hits)
        dsched.update_state_after_alloc(dreq, blocks, n_tokens - hits * dbs)
        dmeta = dsched.build_connector_meta()
        for w in dec:
            w.on_meta(dmeta)
        for r, w in enumerate(dec):
            until(f"decode rank {r} to report the pull", lambda w=w: (w.finished()[1] or ()))
        errors = [w.take_load_errors() for w in dec]
        failed = [w.take_failed_reqs() for w in dec]
        if expect_refusal is not None:
            if len(dst_groups) > 1:  # block ids are per group: vLLM takes failed requests
                assert not any(errors) and all(f == {"req-1"} for f in failed), (errors, failed)
                print("   refused as expected, the request reported failed")
                return
            want = {b for g in blocks.get_unhashed_block_ids_all_groups() for b in g}
            assert all(e == want for e in errors) and not any(failed), (errors, failed)
            print(f"   refused as expected, every local block reported failed: {sorted(want)}")
            return
        assert not any(failed), f"failed requests {failed}"
        assert not any(errors), f"load errors {errors}"
        # Every pulled block holds what the prefill held for this rank's heads.
        for i, (kv, _) in enumerate(dec_kv):
            r = i % dtp
            hs = heads_of(r, dtp, total)
            if pbs != dbs:  # token by token: each lands at its place in the decode's blocks
                for g, (src, dst) in enumerate(zip(src_groups, dst_groups)):
                    dst = [0 if (g == 0 and j < hits) else d for j, d in enumerate(dst)]
                    for n, t in kv.items():
                        full = ref[n if n in ref else ("t" + n[-1])]
                        want = token_rows(kind, full, src, pbs, n_tokens,
                                          None if kind == "mla" else hs)
                        got = token_rows(kind, t, dst, dbs, n_tokens)
                        assert got and set(got) <= set(want), (sorted(got), sorted(want))
                        for tok, row in got.items():
                            assert torch.equal(row, want[tok]), f"rank {r} {n} token {tok}"
                continue
            for g, (src, dst) in enumerate(zip(src_groups, dst_groups)):
                for i, (s, d) in enumerate(zip(src, dst)):
                    if s == 0 or d == 0 or (g == 0 and i < hits):
                        continue
                    for n, t in kv.items():
                        full = ref[n if n in ref else ("t" + n[-1])]
                        if kind == "mla":
                            want = full[s]
                            got = t[d]
                        elif kind == "nhd":
                            want = full[:, s][:, :, hs]
                            got = t[:, d]
                        else:
                            want = full[s][hs]
                            got = t[d]
                        assert torch.equal(got, want), f"rank {r} {n} block {s}->{d} differs"
        # Blocks nobody pulled into (a local prefix hit among them) stay untouched.
        moved = {d for g in blocks.get_unhashed_block_ids_all_groups() for d in g}
        for kv, _ in dec_kv:
            for t in kv.values():
                bdim = 1 if kind == "nhd" else 0
                for b in range(NB):
                    if b not in moved:
                        assert not t.select(bdim, b).any(), f"block {b} was written"
        # Each prefill rank's lease ends, so vLLM frees the request's blocks there.
        for r, w in enumerate(pre):
            until(f"prefill rank {r}'s lease to end",
                  lambda w=w: "req-1" in (w.finished()[0] or ()))
        print(f"   every block verified on {len(dec)} decode worker(s); all {len(pre)} prefill "
              "leases ended")
    finally:
        for w in pre + dec:
            w.shutdown()


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    # Each decode block pairs with the prefill's block at its position; which cannot land:
    # past the prefill's blocks, or facing its null block.
    assert group_pairs([[3, 4, 5]], [[8, 9]], [[1, 2]]) == [([4, 5], [8, 9])]
    assert group_pairs([[0, 0, 5, 6]], [[8, 9]], [[2, 3]]) == [([5, 6], [8, 9])]
    assert missing_blocks([[3, 4]], [[7, 8, 9]], [[0, 1, 2]]) == [9]
    assert missing_blocks([[0, 4]], [[7, 8]], [[0, 1]]) == [7]
    assert missing_blocks([[1, 2, 3]], [[7, 8]], [[2, 3]]) == [8]
    assert missing_blocks([[1, 2], [0, 0, 5]], [[7, 8], [11]], [[0, 1], [2]]) == []
    # Which prefill stage gives which decode layers: runs consecutive on both sides.
    assert layer_runs((0, [4, 5]), (2, [3, 4, 5, 6])) == [(range(0, 2), range(3, 5))]
    assert layer_runs((1, [0, 2]), (0, [0, 1, 2])) == [(range(1, 2), range(0, 1)),
                                                       (range(2, 3), range(2, 3))]
    assert uncovered([(0, [0, 1])], [[(0, [0])]]) == ("no prefill stage holds layers [1] of "
                                                     "KV cache group 0")
    full = ([[3, 4, 5, 9]], [[7, 8, 1, 2]])
    case("same TP", "cpu", 1, 1, 2, *full)
    case("prefill TP > decode TP", "cpu", 2, 1, 2, *full)
    case("prefill TP < decode TP", "cpu", 1, 2, 2, *full)
    case("prefill TP 4 over 2 KV heads (replicas) -> decode TP 2", "cpu", 4, 2, 2, *full)
    case("K/V apart, tokens first (GPU backends' layout), P2 -> D1", "nhd", 2, 1, 4, *full)
    case("K/V apart, tokens first, P1 -> D2", "nhd", 1, 2, 4, *full)
    # A long prompt: the sliding-window group holds blocks at its last positions only, on
    # both sides (vLLM's list of the decode's new blocks leaves out its null blocks).
    hybrid = ([[3, 4, 5, 9, 10, 15], [0, 0, 0, 11, 12, 16]],
              [[7, 8, 1, 2, 17, 18], [0, 0, 0, 13, 14, 19]])
    case("hybrid: full + sliding window sharing tensors, null blocks", "hybrid", 1, 1, 2,
         *hybrid)
    case("hybrid, P2 -> D1", "hybrid", 2, 1, 2, *hybrid)
    case("hybrid, a local prefix hit of 2 blocks", "hybrid", 1, 1, 2, *hybrid, hits=2)
    case("same TP, a local prefix hit of 1 block", "cpu", 1, 1, 2, *full, hits=1)
    case("MLA, same TP", "mla", 1, 1, 1, *full)
    case("MLA, P2 -> D1 (read once, unsplit)", "mla", 2, 1, 1, *full)
    case("MLA, P1 -> D2", "mla", 1, 2, 1, *full)
    # Different block sizes: every token lands at its place.
    # vLLM's CPU attention (its vec kernels, blocks of a multiple of 32): a transposed K plane
    case("CPU layout, blocks of 32 -> 64", "cpu", 1, 1, 2, [[3, 4, 5, 9]], [[7, 8]],
         p_block_size=2 * BS, d_block_size=4 * BS)
    case("CPU layout, blocks of 64 -> 32, TP 2 -> 1", "cpu", 2, 1, 2, [[3, 4]],
         [[7, 8, 1, 2]], p_block_size=4 * BS, d_block_size=2 * BS)
    case("CPU layout, blocks of 32 -> 128, a partial last block, a local prefix hit", "cpu",
         1, 1, 2, [[3, 4, 5, 9, 10, 11, 12, 13]], [[7, 8]], p_block_size=2 * BS,
         d_block_size=8 * BS, tokens=15 * BS + 5, hits=1)
    case("CPU layout, blocks of 16 (vec16 kernels) -> 32: refused", "cpu", 1, 1, 2,
         [[3, 4, 5, 9]], [[7, 8]], d_block_size=2 * BS, expect_refusal="block_size")
    case("blocks of 16 -> 32 with TP 2 -> 1, K/V apart", "nhd", 2, 1, 4, [[3, 4, 5, 9]],
         [[7, 8]], d_block_size=2 * BS)
    case("blocks of 64 -> 16 with TP 1 -> 2, K/V apart", "nhd", 1, 2, 4, [[3]],
         [[7, 8, 1, 2]], p_block_size=4 * BS)
    case("MLA, blocks of 32 -> 16, TP 2 -> 1", "mla", 2, 1, 1, [[3, 4]], [[7, 8, 1, 2]],
         p_block_size=2 * BS)
    case("hybrid, blocks of 32 -> 64", "hybrid", 1, 1, 2, hybrid[0],
         [[7, 8, 17], [0, 0, 19]], p_block_size=2 * BS, d_block_size=4 * BS)
    case("block sizes differ, the decode cannot convert (fp8, no shard): refused", "nhd", 1,
         1, 4, [[3, 4, 5, 9]], [[7, 8]], d_block_size=2 * BS, expect_refusal="block_size",
         no_shard=True)
    # Pipeline parallelism: each decode layer from the prefill stage holding it.
    case("PP 2 -> PP 1", "cpu", 1, 1, 2, *full, ppp=2)
    case("PP 2 -> PP 1 with TP 2 -> 1, K/V apart", "nhd", 2, 1, 4, *full, ppp=2)
    case("PP 2 -> PP 2 with TP 1 -> 2", "cpu", 1, 2, 2, *full, ppp=2, dpp=2)
    case("PP 2 -> PP 1, hybrid, blocks of 32 -> 64", "hybrid", 1, 1, 2, hybrid[0],
         [[7, 8, 17], [0, 0, 19]], p_block_size=2 * BS, d_block_size=4 * BS, ppp=2)
    case("PP 1 -> PP 2 (one prefill stage read by two decode stages): refused", "cpu", 1, 1,
         2, *full, dpp=2, expect_refusal="pp")
    case("TP pair that does not map (3 heads over TP 2): refused", "cpu", 1, 2, 3,
         [[3, 4]], [[7, 8]], expect_refusal="tp")
    case("hybrid, block sizes differ without a shard: refused, per request", "hybrid", 1, 1, 2,
         *hybrid, d_block_size=2 * BS, expect_refusal="block_size", no_shard=True)
    print("all worker-half cases hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
