"""KV pools as SGLang's schedulers build them (SGLang's own pool classes on CPU tensors), the
``KVArgs`` a scheduler hands its KV manager, and the byte pattern every page is checked by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import torch

#: KV geometries of real models (num_hidden_layers, num_key_value_heads, head_dim, bf16; MLA:
#: kv_lora_rank + qk_rope_head_dim), and a tiny one for the correctness runs.
MODELS: Dict[str, Dict[str, Any]] = {
    "tiny": {"layers": 4, "heads": 4, "head_dim": 64},
    "tiny-mla": {"layers": 4, "mla": (64, 16)},
    # a hybrid: layers 1 and 3 attend over a sliding window of 256 tokens, held in SGLang's
    # SWA sub-pool and sent as the request's SWA state
    "tiny-swa": {"layers": 4, "heads": 4, "head_dim": 64, "swa_layers": [1, 3], "window": 256},
    "llama-3.1-8b": {"layers": 32, "heads": 8, "head_dim": 128},
    "llama-3.1-70b": {"layers": 80, "heads": 8, "head_dim": 128},
    "deepseek-r1": {"layers": 61, "mla": (512, 64)},
}


@dataclass
class Geometry:
    model: str
    layers: int
    heads: int  # total KV heads (1 for MLA)
    head_dim: int  # per head (MLA: latent + rope)
    mla: bool
    tp: int
    rank: int
    page: int
    swa_layers: Tuple[int, ...] = ()
    window: int = 0

    def window_start(self, tokens: int) -> int:
        """The first token of a request's SWA state (page-aligned, as prefill.py sends it)."""
        return max(0, tokens - self.window) // self.page * self.page if self.swa_layers else 0

    @property
    def local_heads(self) -> int:
        return self.heads if self.mla else self.heads // self.tp

    @property
    def head0(self) -> int:
        """The first global KV head this rank holds."""
        return 0 if self.mla else self.rank * self.local_heads

    def bytes_per_token(self) -> int:
        """KV bytes per token of this rank (both K and V for MHA), bf16."""
        per_layer = self.local_heads * self.head_dim * 2
        return self.layers * per_layer * (1 if self.mla else 2)


def geometry(model: str, tp: int, rank: int, page: int) -> Geometry:
    m = MODELS[model]
    if "mla" in m:
        lora, rope = m["mla"]
        return Geometry(model, m["layers"], 1, lora + rope, True, tp, rank, page)
    if m["heads"] % tp:
        raise ValueError(f"{model} has {m['heads']} KV heads, which TP {tp} does not divide")
    return Geometry(model, m["layers"], m["heads"], m["head_dim"], False, tp, rank, page,
                    tuple(m.get("swa_layers", ())), int(m.get("window", 0)))


def make_pool(g: Geometry, tokens: int) -> Any:
    """SGLang's token-to-KV pool for this rank: MHA (a K and a V buffer per layer,
    ``[tokens + page, local heads, head_dim]``) or MLA (one latent buffer per layer)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

    if g.swa_layers:
        from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

        full = [i for i in range(g.layers) if i not in g.swa_layers]
        return SWAKVPool(tokens, tokens, g.page, torch.bfloat16, g.local_heads, g.head_dim,
                         list(g.swa_layers), full, "cpu", enable_memory_saver=False)
    if g.mla:
        lora, rope = MODELS[g.model]["mla"]
        return MLATokenToKVPool(tokens, g.page, torch.bfloat16, lora, rope, g.layers, "cpu",
                                False)
    return MHATokenToKVPool(tokens, g.page, torch.bfloat16, g.local_heads, g.head_dim,
                            g.layers, "cpu", False)


def buffers(pool: Any, g: Geometry) -> List[Tuple[str, int, Any]]:
    """(K or V, layer, int16 numpy view ``[rows, local heads, dim]``) of every buffer."""
    out = []
    if g.swa_layers:  # the full-attention layers, then the SWA sub-pool ("swa_k", "swa_v")
        for pre, sub in (("", pool.full_kv_pool), ("swa_", pool.swa_kv_pool)):
            for layer, t in enumerate(sub.k_buffer):
                out.append((pre + "k", layer, t.view(torch.int16).numpy()))
            for layer, t in enumerate(sub.v_buffer):
                out.append((pre + "v", layer, t.view(torch.int16).numpy()))
        return out
    if g.mla:
        for layer, t in enumerate(pool.kv_buffer):
            out.append(("kv", layer, t.view(torch.int16).numpy()))
        return out
    for layer, t in enumerate(pool.k_buffer):
        out.append(("k", layer, t.view(torch.int16).numpy()))
    for layer, t in enumerate(pool.v_buffer):
        out.append(("v", layer, t.view(torch.int16).numpy()))
    return out


def pattern(room: int, kind: str, layer: int, tokens: int, head0: int, heads: int,
            dim: int, t0: int = 0) -> np.ndarray:
    """The bytes a request's KV holds: a function of (room, K/V, layer, token, global head,
    element), so a page landing at the wrong place, head or layer is told apart."""
    kinds = {"k": 1, "v": 2, "kv": 3, "swa_k": 4, "swa_v": 5}
    seed = (room * 1000003 + layer * 131 + kinds[kind] * 7919) & 0xFFFF
    t = np.arange(t0, t0 + tokens, dtype=np.uint32)[:, None, None]
    h = np.arange(head0, head0 + heads, dtype=np.uint32)[None, :, None]
    d = np.arange(dim, dtype=np.uint32)[None, None, :]
    return ((seed + t * 40503 + h * 9973 + d * 31) & 0xFFFF).astype(np.uint16).view(np.int16)


def rows(pages: Sequence[int], tokens: int, page: int) -> np.ndarray:
    """The pool rows of a request's tokens, in token order."""
    p = np.asarray(pages, dtype=np.int64)
    return (p[:, None] * page + np.arange(page)[None, :]).reshape(-1)[:tokens]


def _spans(g: Geometry, kind: str, pages: Sequence[int], swa_pages: Sequence[int],
           tokens: int) -> Tuple[np.ndarray, int, int]:
    """(pool rows, first token, token count) a buffer holds of a request: all its tokens, or
    for the SWA sub-pool the window's."""
    if kind.startswith("swa_"):
        t0 = g.window_start(tokens)
        return rows(swa_pages, tokens - t0, g.page), t0, tokens - t0
    return rows(pages, tokens, g.page), 0, tokens


def fill(pool_bufs: List[Tuple[str, int, Any]], g: Geometry, room: int, pages: List[int],
         tokens: int, swa_pages: Sequence[int] = ()) -> None:
    for kind, layer, arr in pool_bufs:
        r, t0, n = _spans(g, kind, pages, swa_pages, tokens)
        arr[r] = pattern(room, kind, layer, n, g.head0, arr.shape[1], arr.shape[2], t0)


def check(pool_bufs: List[Tuple[str, int, Any]], g: Geometry, room: int, pages: List[int],
          tokens: int, swa_pages: Sequence[int] = ()) -> List[str]:
    """What differs from the pattern, one line per buffer (empty when every byte is right)."""
    bad = []
    for kind, layer, arr in pool_bufs:
        r, t0, n = _spans(g, kind, pages, swa_pages, tokens)
        want = pattern(room, kind, layer, n, g.head0, arr.shape[1], arr.shape[2], t0)
        got = arr[r]
        if not np.array_equal(got, want):
            wrong = np.argwhere(got != want)
            t, h = int(wrong[0][0]), int(wrong[0][1])
            bad.append(f"room {room} {kind}{layer}: {len(wrong)} elements differ, first at "
                       f"token {t0 + t} head {g.head0 + h}")
    return bad


def mark(pool_bufs: List[Tuple[str, int, Any]], g: Geometry, pages: List[int],
         swa_pages: List[int], tokens: int, value: int) -> None:
    """Writes ``value`` into every element a request holds."""
    for kind, _layer, arr in pool_bufs:
        arr[_spans(g, kind, pages, swa_pages, tokens)[0]] = value


def unmarked(pool_bufs: List[Tuple[str, int, Any]], g: Geometry, pages: List[int],
             swa_pages: List[int], tokens: int, value: int) -> List[str]:
    """The buffers where a request's elements no longer all hold ``value``."""
    return [f"{kind}{layer}" for kind, layer, arr in pool_bufs
            if (arr[_spans(g, kind, pages, swa_pages, tokens)[0]] != value).any()]


def kv_args(kv_class: Any, pool: Any, g: Geometry, metadata: Any) -> Any:
    """The KVArgs prefill.py / decode.py build (``_init_kv_manager``) for this pool."""
    from sglang.srt.disaggregation.utils import (build_kv_layer_ids, get_kv_transfer_buf_infos,
                                                 setup_state_kv_args)

    a = kv_class()
    a.engine_rank = g.rank
    a.pp_rank = 0
    a.system_dp_rank = 0
    a.rust_http_port = None
    a.kv_cache_dtype_str = "bfloat16"
    a.kv_layout = None
    a.prefill_start_layer = 0
    ptrs, lens, item_lens = get_kv_transfer_buf_infos(pool)
    a.prefill_end_layer = g.layers
    a.kv_data_ptrs, a.kv_data_lens, a.kv_item_lens = ptrs, lens, item_lens
    a.num_draft_entries = 0
    a.kv_layer_ids = build_kv_layer_ids(token_to_kv_pool=pool, draft_token_to_kv_pool=None,
                                        num_draft_entries=0, num_hidden_layers=g.layers)
    if not g.mla:
        a.kv_head_num = g.local_heads
        a.total_kv_head_num = g.heads
    a.page_size = g.page
    a.aux_data_ptrs, a.aux_data_lens, a.aux_item_lens = metadata.get_buf_infos()
    a.ib_device = None
    a.gpu_id = 0
    setup_state_kv_args(a, pool, None, g.layers, req_to_token_pool=None)
    return a
