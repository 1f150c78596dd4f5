#!/usr/bin/env python3
"""A prefill/decode KV-cache exchange written against the documented ``llm_datadist`` usage
(register blocks caches, link, pull scattered blocks by BlocksCacheKey, push blocks, layer-wise
push with transfer_cache_async); only its import line names hixl. The two roles run as two
processes; a line on stdout ("BARRIER n") and one on stdin ("go") stand in for the process
group barrier of the official samples.

Run: dd_sample.py --role p|d --local_host_ip IP --remote_host_ip IP --local_port P
     --remote_port Q [--transport tcp|fabric]
"""

import argparse
import logging
import sys
from typing import Optional

import numpy as np

from hixl.llm_datadist import (
    LLMDataDist,
    LLMRole,
    LLMConfig,
    CacheDesc,
    DataType,
    BlocksCacheKey,
    Placement,
    LLMClusterInfo,
    LLMStatusCode,
    TransferWithCacheKeyConfig,
    LayerSynchronizer,
)

logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO, stream=sys.stderr)

NUM_LAYERS = 4
NUM_TENSORS = NUM_LAYERS * 2
BLOCKS_NUM = 12
BLOCK_SHAPE = [16, 2, 8]  # tokens per block, kv heads, head dim
PROMPT_CLUSTER_ID = 0
DECODER_CLUSTER_ID = 1

PULL_SRC = [1, 2, 3, 7, 9]  # a request's blocks at the prompt
PULL_DST = [0, 5, 6, 2, 11]  # where the decoder keeps them
PUSH_SRC = [4, 5]  # decoder blocks pushed back to the prompt
PUSH_DST = [10, 0]
LAYER_SRC = [0, 8, 11]  # prompt blocks sent layer by layer
LAYER_DST = [3, 4, 10]

_barriers = 0


def barrier():
    global _barriers
    _barriers += 1
    print(f"BARRIER {_barriers}", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise RuntimeError("barrier broken")


def pattern(cluster_id, tensor, block):
    return float(cluster_id * 100000 + tensor * 1000 + block + 1)


def kv_tensors(cluster_id, fill):
    tensors = []
    for t in range(NUM_TENSORS):
        a = np.zeros([BLOCKS_NUM] + BLOCK_SHAPE, dtype=np.float32)
        if fill:
            for b in range(BLOCKS_NUM):
                a[b] = pattern(cluster_id, t, b)
        tensors.append(a)
    return tensors


def check(name, tensors, expected):
    """expected[(t, b)] = value; every other block must still be 0."""
    bad = 0
    for t, a in enumerate(tensors):
        for b in range(BLOCKS_NUM):
            want = expected.get((t, b), 0.0)
            if not np.array_equal(a[b], np.full(BLOCK_SHAPE, want, dtype=np.float32)):
                bad += 1
                logging.error(f"{name}: tensor {t} block {b} is not {want}")
    if bad:
        raise Exception(f"{name}: {bad} blocks wrong")
    print(f"CHECKED {name} {NUM_TENSORS * BLOCKS_NUM} blocks", flush=True)


def init_llm_datadist(role: LLMRole, cluster_id, args) -> LLMDataDist:
    datadist = LLMDataDist(role, cluster_id)
    llm_config = LLMConfig()
    llm_config.device_id = 0
    llm_config.local_comm_res = ""
    llm_config.transfer_backend = "hixl"
    llm_config.enable_cache_manager = True
    llm_config.enable_remote_cache_accessible = True
    llm_config.sync_kv_timeout = 5000
    llm_config.listen_ip_info = f"{args.local_host_ip}:{args.local_port}"
    if args.transport:
        llm_config.ge_options = {"hixl.Transport": args.transport}
    datadist.init(llm_config.generate_options())
    logging.info(f"init {role} success, cluster_id={cluster_id}")
    return datadist


def link(datadist, remote_cluster_id, args):
    cluster = LLMClusterInfo()
    cluster.remote_cluster_id = remote_cluster_id
    cluster.append_local_ip_info(args.local_host_ip, args.local_port)
    cluster.append_remote_ip_info(args.remote_host_ip, args.remote_port)
    ret, rets = datadist.link_clusters([cluster], 5000)
    if ret != LLMStatusCode.LLM_SUCCESS:
        raise Exception(f"link failed: {ret} {rets}")


def unlink(datadist, remote_cluster_id):
    cluster = LLMClusterInfo()
    cluster.remote_cluster_id = remote_cluster_id
    ret, _ = datadist.unlink_clusters([cluster], 5000, force=True)
    if ret != LLMStatusCode.LLM_SUCCESS:
        raise Exception("unlink failed")


class LayerSynchronizerImpl(LayerSynchronizer):
    def __init__(self):
        self.layers = []

    def synchronize_layer(self, layer_index: int, timeout_in_millis: Optional[int]) -> bool:
        self.layers.append(layer_index)  # the model's layer `layer_index` is computed here
        return True


def run_prompt_sample(datadist, args):
    cache_manager = datadist.cache_manager
    cache_desc = CacheDesc(num_tensors=NUM_TENSORS, shape=[BLOCKS_NUM] + BLOCK_SHAPE,
                           data_type=DataType.DT_FLOAT, placement=Placement.HOST)
    kv = kv_tensors(PROMPT_CLUSTER_ID, fill=True)
    cache = cache_manager.register_blocks_cache(cache_desc, [t.ctypes.data for t in kv],
                                                BlocksCacheKey(PROMPT_CLUSTER_ID, 0))
    inbox = kv_tensors(PROMPT_CLUSTER_ID, fill=False)
    inbox_cache = cache_manager.register_blocks_cache(
        cache_desc, [t.ctypes.data for t in inbox], BlocksCacheKey(PROMPT_CLUSTER_ID, 1))
    logging.info("register_blocks_cache success")
    barrier()  # both registered

    link(datadist, DECODER_CLUSTER_ID, args)
    barrier()  # both linked

    sync = LayerSynchronizerImpl()
    transfer_config = TransferWithCacheKeyConfig(BlocksCacheKey(DECODER_CLUSTER_ID, 1),
                                                 range(0, NUM_LAYERS), range(0, NUM_LAYERS))
    cache_task = cache_manager.transfer_cache_async(cache, sync, [transfer_config],
                                                    src_block_indices=LAYER_SRC,
                                                    dst_block_indices=LAYER_DST)
    ret = cache_task.synchronize()
    if ret != LLMStatusCode.LLM_SUCCESS or cache_task.get_results() != [LLMStatusCode.LLM_SUCCESS]:
        raise Exception(f"transfer_cache_async failed: {ret}")
    if sync.layers != list(range(NUM_LAYERS)):
        raise Exception(f"synchronize_layer was called for {sync.layers}")
    barrier()  # decoder pulled and pushed, prompt sent its layers

    check("prompt inbox (push_blocks)", inbox,
          {(t, d): pattern(DECODER_CLUSTER_ID, t, s)
           for t in range(NUM_TENSORS) for s, d in zip(PUSH_SRC, PUSH_DST)})
    check("prompt cache (unchanged)", kv,
          {(t, b): pattern(PROMPT_CLUSTER_ID, t, b)
           for t in range(NUM_TENSORS) for b in range(BLOCKS_NUM)})
    barrier()  # both checked

    unlink(datadist, DECODER_CLUSTER_ID)
    cache_manager.unregister_cache(cache.cache_id)
    cache_manager.unregister_cache(inbox_cache.cache_id)
    datadist.finalize()
    logging.info("[finalize] success")


def run_decoder_sample(datadist, args):
    cache_manager = datadist.cache_manager
    cache_desc = CacheDesc(num_tensors=NUM_TENSORS, shape=[BLOCKS_NUM] + BLOCK_SHAPE,
                           data_type=DataType.DT_FLOAT, placement=Placement.HOST)
    kv = kv_tensors(DECODER_CLUSTER_ID, fill=False)
    cache = cache_manager.register_blocks_cache(cache_desc, [t.ctypes.data for t in kv],
                                                BlocksCacheKey(DECODER_CLUSTER_ID, 0))
    layered = kv_tensors(DECODER_CLUSTER_ID, fill=False)
    layered_cache = cache_manager.register_blocks_cache(
        cache_desc, [t.ctypes.data for t in layered], BlocksCacheKey(DECODER_CLUSTER_ID, 1))
    logging.info("register_blocks_cache success")
    barrier()  # both registered

    link(datadist, PROMPT_CLUSTER_ID, args)
    barrier()  # both linked

    cache_manager.pull_blocks(BlocksCacheKey(PROMPT_CLUSTER_ID, 0), cache, PULL_SRC, PULL_DST,
                              src_layer_range=range(0, NUM_LAYERS),
                              dst_layer_range=range(0, NUM_LAYERS))
    check("decoder cache (pull_blocks)", kv,
          {(t, d): pattern(PROMPT_CLUSTER_ID, t, s)
           for t in range(NUM_TENSORS) for s, d in zip(PULL_SRC, PULL_DST)})
    for t in range(NUM_TENSORS):
        for b in PUSH_SRC:
            kv[t][b] = pattern(DECODER_CLUSTER_ID, t, b)
    cache_manager.push_blocks(BlocksCacheKey(PROMPT_CLUSTER_ID, 1), cache,
                              src_blocks=PUSH_SRC, dst_blocks=PUSH_DST)
    barrier()  # decoder pulled and pushed, prompt sent its layers

    check("decoder layered cache (transfer_cache_async)", layered,
          {(t, d): pattern(PROMPT_CLUSTER_ID, t, s)
           for t in range(NUM_TENSORS) for s, d in zip(LAYER_SRC, LAYER_DST)})
    barrier()  # both checked

    unlink(datadist, PROMPT_CLUSTER_ID)
    cache_manager.unregister_cache(cache.cache_id)
    cache_manager.unregister_cache(layered_cache.cache_id)
    datadist.finalize()
    logging.info("[finalize] success")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", type=str, required=True, help="p or d")
    parser.add_argument("--local_host_ip", type=str, default="127.0.0.1")
    parser.add_argument("--remote_host_ip", type=str, default="127.0.0.1")
    parser.add_argument("--local_port", type=int, required=True)
    parser.add_argument("--remote_port", type=int, required=True)
    parser.add_argument("--transport", type=str, default="")
    args = parser.parse_args()
    role = LLMRole.PROMPT if args.role == "p" else LLMRole.DECODER
    cluster_id = PROMPT_CLUSTER_ID if args.role == "p" else DECODER_CLUSTER_ID
    datadist = init_llm_datadist(role, cluster_id, args)
    if role == LLMRole.PROMPT:
        run_prompt_sample(datadist, args)
    else:
        run_decoder_sample(datadist, args)
    print("SAMPLE DONE", flush=True)
