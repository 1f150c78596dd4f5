"""``CacheManager``'s pulls across tensor-parallel sizes (a hixl extension)."""

from __future__ import annotations

from typing import Any, Sequence

from ._status import _type_error
from ._manager import _Manager, _kw
from ._types import BlocksCacheKey, Cache, _int, _ints, _U32


class _Reshard(_Manager):
    """Heterogeneous tensor parallelism."""

    def set_kv_shard(self, cache: Cache, tp_rank: int, tp_size: int, total_heads: int,
                     head_dim: int, layout: str = "NHD", mla: bool = False) -> None:
        """hixl extension: declares which KV heads ``cache`` holds (rank ``tp_rank`` of a TP
        group of ``tp_size`` over ``total_heads`` heads of ``head_dim`` elements). Its shape is
        ``[blocks, tokens, heads, head_dim]`` (``"NHD"``), ``[blocks, heads, tokens, head_dim]``
        (``"HND"``), or ``[blocks, tokens, latent]`` for ``mla``. Peers see it at link time."""
        self._check()
        c = self._registered("cache", cache)
        if not isinstance(layout, str):
            raise _type_error(f"layout must be \"NHD\" or \"HND\", got {layout!r}")
        self._native.set_kv_shard(c.cache_id, _int("tp_rank", tp_rank, 0, _U32),
                                  _int("tp_size", tp_size, 1, _U32),
                                  _int("total_heads", total_heads, 1, _U32),
                                  _int("head_dim", head_dim, 1, _U32), layout, bool(mla))

    def pull_kv_blocks_resharded(self, src_cache_keys: Sequence[BlocksCacheKey], dst_cache: Cache,
                                 src_blocks: Sequence[int], dst_blocks: Sequence[int],
                                 **kwargs: Any) -> None:
        """hixl extension: pulls blocks into ``dst_cache`` (a decode rank's cache with a shard)
        from the prefill ranks' blocks caches ``src_cache_keys`` (one per prefill rank, each
        with a shard of one TP group, all linked): each head comes from a rank that holds it,
        moved straight into this rank's layout. Keyword arguments and failures as
        :meth:`pull_blocks`."""
        self._check()
        if not isinstance(src_cache_keys, (list, tuple)) or not all(
                isinstance(k, BlocksCacheKey) for k in src_cache_keys):
            raise _type_error(f"src_cache_keys must be a list of BlocksCacheKey, got "
                              f"{src_cache_keys!r}")
        dst = self._registered("dst_cache", dst_cache)
        ext = _kw("pull_kv_blocks_resharded", kwargs)
        self._native.pull_resharded([k._tuple() for k in src_cache_keys], dst.cache_id,
                                    _ints("src_blocks", src_blocks),
                                    _ints("dst_blocks", dst_blocks), ext)
