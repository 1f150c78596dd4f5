"""The peer process of the llm_datadist tests: one LLMDataDist cluster holding numpy caches,
driven by JSON commands on stdin, one JSON answer per line on stdout.

argv[1] is a JSON object: cluster, transport, layers, blocks, elems, seed, sync_ms.
Caches (float32, every block of tensor t filled with value(seed, t, b)):
  src        blocks cache under BlocksCacheKey(cluster, 0), filled
  recv       blocks cache under BlocksCacheKey(cluster, 1), zero
  cont       contiguous cache of 4 entries, CacheKey(cluster, 100 + i) naming entry i, filled
             with seed + 1
  cont_recv  contiguous cache of 4 entries, zero
"""

import json
import os
import sys

import numpy as np

from hixl.llm_datadist import (BlocksCacheKey, CacheDesc, CacheKey, DataType, LLMClusterInfo,
                               LLMConfig, LLMDataDist, LLMException, LLMRole, Placement)


def value(seed, t, b):
    return float(seed * 100000 + t * 1000 + b)


def filled(seed, tensors, blocks, elems):
    arrs = []
    for t in range(tensors):
        a = np.empty((blocks, elems), np.float32)
        for b in range(blocks):
            a[b] = value(seed, t, b)
        arrs.append(a)
    return arrs


def digest(arrs):
    """Per tensor, per block: the block's value if every element holds it, else None."""
    out = []
    for a in arrs:
        row = []
        for blk in a.reshape(a.shape[0], -1):
            row.append(float(blk[0]) if (blk == blk[0]).all() else None)
        out.append(row)
    return out


def main():
    cfg = json.loads(sys.argv[1])
    cid, L, B, E, seed = cfg["cluster"], cfg["layers"], cfg["blocks"], cfg["elems"], cfg["seed"]
    dd = LLMDataDist(LLMRole.PROMPT, cid)
    c = LLMConfig()
    c.device_id = 0
    c.listen_ip_info = "127.0.0.1:0"
    c.sync_kv_timeout = cfg.get("sync_ms", 5000)
    c.ge_options = {"hixl.Transport": cfg["transport"]}
    dd.init(c.generate_options())
    cm = dd.cache_manager
    desc = CacheDesc(2 * L, [B, E], DataType.DT_FLOAT, placement=Placement.HOST)
    cdesc = CacheDesc(2 * L, [4, E], DataType.DT_FLOAT, placement=Placement.HOST)
    arrays = {
        "src": filled(seed, 2 * L, B, E),
        "recv": [np.zeros((B, E), np.float32) for _ in range(2 * L)],
        "cont": filled(seed + 1, 2 * L, 4, E),
        "cont_recv": [np.zeros((4, E), np.float32) for _ in range(2 * L)],
    }
    addrs = {n: [a.ctypes.data for a in arrs] for n, arrs in arrays.items()}
    caches = {
        "src": cm.register_blocks_cache(desc, addrs["src"], BlocksCacheKey(cid, 0)),
        "recv": cm.register_blocks_cache(desc, addrs["recv"], BlocksCacheKey(cid, 1)),
        "cont": cm.register_cache(cdesc, addrs["cont"], [CacheKey(cid, 100 + i) for i in range(4)]),
        "cont_recv": cm.register_cache(cdesc, addrs["cont_recv"]),
    }

    def say(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    say({"ready": dd.listen_ip_info, "pid": os.getpid(),
         "ids": {n: c.cache_id for n, c in caches.items()}, "addrs": addrs})
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "digest":
                say({"digest": digest(arrays[cmd["cache"]])})
            elif op == "link":
                ci = LLMClusterInfo()
                ci.remote_cluster_id = cmd["cluster"]
                ip, port = cmd["addr"].rsplit(":", 1)
                ci.append_remote_ip_info(ip, int(port))
                ret, rets = dd.link_clusters([ci], 5000)
                say({"ret": ret.name, "rets": [r.name for r in rets]})
            elif op == "lease":
                g = cm.lease_blocks(cmd["request"], [caches[n] for n in cmd.get("caches", ["src"])],
                                    cmd["blocks"], cmd.get("ttl_ms", 30000),
                                    lease_id=cmd.get("lease_id"), generation=cmd.get("generation"))
                say({"grant": g.to_dict()})
            elif op == "end_lease":
                cm.end_lease(cmd["lease"])
                say({"ok": True})
            elif op == "events":
                evs = cm.lease_events(cmd.get("timeout_ms", 0))
                say({"events": [list(e) for e in evs]})
            elif op == "live":
                say({"live": cm.live_leases()})
            elif op == "unregister":
                cm.unregister_cache(caches[cmd["cache"]].cache_id)
                say({"ok": True})
            elif op == "remove_key":
                cm.remove_cache_key(CacheKey(cid, cmd["req"]))
                say({"ok": True})
            elif op == "shards":
                # TP ranks of one model, as blocks caches under model ids 10 + rank: NHD blocks
                # [tokens, heads/tp, head_dim], element = head * 100 + token * 10 + t + seed.
                tp, H, T, D = cmd["tp"], cmd["heads"], cmd["tokens"], cmd["head_dim"]
                out = {}
                for r in range(tp):
                    h0, hn = r * H // tp, H // tp
                    arrs = []
                    for t in range(2 * L):
                        a = np.empty((B, T, hn, D), np.float32)
                        for h in range(hn):
                            for tok in range(T):
                                a[:, tok, h, :] = (h0 + h) * 100 + tok * 10 + t + \
                                    np.arange(B, dtype=np.float32)[:, None] * 10000
                        arrs.append(a)
                    arrays[f"tp{r}"] = arrs
                    d = CacheDesc(2 * L, [B, T, hn, D], DataType.DT_FLOAT,
                                  placement=Placement.HOST)
                    c = cm.register_blocks_cache(d, [a.ctypes.data for a in arrs],
                                                 BlocksCacheKey(cid, 10 + r))
                    cm.set_kv_shard(c, r, tp, H, D, "NHD")
                    caches[f"tp{r}"] = c
                    out[f"tp{r}"] = c.cache_id
                say({"ids": out})
            elif op == "exit":
                if cmd.get("finalize", True):
                    dd.finalize()
                say({"bye": True})
                return
            else:
                say({"error": "UNKNOWN_OP", "message": op})
        except LLMException as e:
            say({"error": e.status_code.name, "message": str(e)})


if __name__ == "__main__":
    main()
