"""Decode side of the Python prefill/decode example: pulls scattered KV blocks from prefill in
one READ per request (an N×3 descriptor array), checks every byte, and tells prefill it is done.

    python examples/python/prefill.py            # terminal 1
    python examples/python/decode.py             # terminal 2
"""

import argparse
import asyncio
import time

import numpy as np

import hixl
from prefill import BLOCK_BYTES, BLOCKS, LAYERS, block_bytes


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill", default="127.0.0.1:26000")
    ap.add_argument("--transport", default="auto", help="auto, tcp or fabric")
    ap.add_argument("--blocks", type=int, default=64, help="blocks of the request")
    a = ap.parse_args()
    rng = np.random.default_rng(7)
    src_blocks = np.sort(rng.choice(BLOCKS, a.blocks, replace=False))  # prefill's block ids
    dst_blocks = np.arange(a.blocks)                                   # where decode puts them
    kv = np.zeros((LAYERS, a.blocks, BLOCK_BYTES), dtype=np.uint8)
    kv.fill(0)  # fault the pages in now, not during the first pull
    with hixl.Engine("127.0.0.1", {"hixl.Transport": a.transport}) as engine:
        local = engine.register(kv, access=hixl.Access.LOCAL)
        peer = None
        for _ in range(100):  # prefill may still be starting
            try:
                peer = await engine.connect(a.prefill, timeout=1.0)
                break
            except hixl.HixlError:
                await asyncio.sleep(0.1)
        if peer is None:
            raise SystemExit(f"decode: no prefill at {a.prefill}")
        remote = peer.region("kv")
        # One descriptor per (layer, block): (local, remote, len) rows of a uint64 array.
        layer = np.repeat(np.arange(LAYERS, dtype=np.uint64), a.blocks)
        descs = np.empty((LAYERS * a.blocks, 3), dtype=np.uint64)
        descs[:, 0] = local.addr + (layer * a.blocks + np.tile(dst_blocks, LAYERS).astype(np.uint64)) * BLOCK_BYTES
        descs[:, 1] = remote.addr + (layer * BLOCKS + np.tile(src_blocks, LAYERS).astype(np.uint64)) * BLOCK_BYTES
        descs[:, 2] = BLOCK_BYTES
        t0 = time.perf_counter()
        await peer.read(descs, timeout=10.0)
        took = time.perf_counter() - t0
        for l in range(LAYERS):
            for i, b in enumerate(src_blocks):
                if not np.array_equal(kv[l, i], block_bytes(l, int(b))):
                    raise SystemExit(f"decode: layer {l} block {b} differs")
        print(f"decode: pulled {len(descs)} blocks ({kv.nbytes >> 20} MiB) over {peer.transport.split()[0]} "
              f"in {took * 1e3:.2f} ms ({kv.nbytes / took / 1e9:.2f} GB/s); every byte verified", flush=True)
        await peer.notify("kv_done", "request-1")


if __name__ == "__main__":
    asyncio.run(main())
