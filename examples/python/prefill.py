"""Prefill side of the Python prefill/decode example: holds a KV cache and lets decode pull it.

    python examples/python/prefill.py            # terminal 1 (listens on 127.0.0.1:26000)
    python examples/python/decode.py             # terminal 2

The KV cache is a numpy array [layers, blocks, block_bytes]. Each block is filled with bytes
derived from (layer, block), so decode can check every byte it pulls. Prefill waits for
decode's "done" notify (naming the request), then exits.
"""

import argparse
import asyncio

import numpy as np

import hixl

LAYERS, BLOCKS, BLOCK_BYTES = 32, 256, 16 * 1024


def block_bytes(layer: int, block: int) -> np.ndarray:
    """What block (layer, block) holds."""
    return ((np.arange(BLOCK_BYTES, dtype=np.uint32) * 31 + layer * 7919 + block * 104729) & 0xFF).astype(np.uint8)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", default="127.0.0.1:26000")
    ap.add_argument("--transport", default="auto", help="auto, tcp or fabric")
    a = ap.parse_args()
    kv = np.empty((LAYERS, BLOCKS, BLOCK_BYTES), dtype=np.uint8)
    for layer in range(LAYERS):
        for block in range(BLOCKS):
            kv[layer, block] = block_bytes(layer, block)
    with hixl.Engine(a.listen, {"hixl.Transport": a.transport}) as engine:
        engine.register(kv, access=hixl.Access.REMOTE_READ, name="kv")
        print(f"prefill: {kv.nbytes >> 20} MiB of KV ({LAYERS} layers x {BLOCKS} blocks) "
              f"registered as 'kv' at {engine.local_engine}; waiting for decode", flush=True)
        async for n in engine.notifications():
            print(f"prefill: {n.sender} says {n.name.decode()} {n.msg.decode()}; "
                  "its blocks can be freed", flush=True)
            break


if __name__ == "__main__":
    asyncio.run(main())
