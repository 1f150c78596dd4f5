"""``CacheManager``'s pulls across tensor-parallel sizes (a hixl extension), and the plan's
pure answers: which prefill ranks a decode rank reads (:func:`kv_shard_sources`), how many
decode ranks read each prefill rank (:func:`kv_shard_readers`)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from .. import _hixl
from ._status import _type_error
from ._manager import _Manager, _kw
from ._types import BlocksCacheKey, Cache, LeaseGrant, _grant, _int, _ints, _U32


def kv_shard_readers(decode_tp: int, prefill_tp: int, total_heads: int,
                     mla: bool = False) -> List[int]:
    """hixl extension: how many ranks of a decode TP group of ``decode_tp`` read each of the
    ``prefill_tp`` prefill ranks of a model of ``total_heads`` KV heads (one count per prefill
    rank; 0 for a replica no decode rank reads). ``LLM_PARAM_INVALID`` when the heads do not
    divide over a group."""
    return _hixl.kv_shard_readers(_int("decode_tp", decode_tp, 1, _U32),
                                  _int("prefill_tp", prefill_tp, 1, _U32),
                                  _int("total_heads", total_heads, 1, _U32), _bool("mla", mla))


def kv_shard_sources(decode_rank: int, decode_tp: int, prefill_tp: int, total_heads: int,
                     mla: bool = False) -> List[int]:
    """hixl extension: the prefill ranks (of a group of ``prefill_tp``) that decode rank
    ``decode_rank`` of ``decode_tp`` reads its heads from, in plan order: the ranks whose
    blocks caches and leases :meth:`CacheManager.pull_leased_blocks_resharded` needs at
    least. ``LLM_PARAM_INVALID`` for a rank past the group or heads that do not divide."""
    return _hixl.kv_shard_sources(_int("decode_rank", decode_rank, 0, _U32),
                                  _int("decode_tp", decode_tp, 1, _U32),
                                  _int("prefill_tp", prefill_tp, 1, _U32),
                                  _int("total_heads", total_heads, 1, _U32), _bool("mla", mla))


def plan_token_blocks(src_blocks: Sequence[Optional[int]], dst_blocks: Sequence[Optional[int]],
                      tokens: int, src_block_tokens: int,
                      dst_block_tokens: int) -> Tuple[List[int], List[int]]:
    """hixl extension: which of a request's destination blocks a token pull
    (:meth:`CacheManager.pull_kv_tokens`) fills, as ``(landing, missing)``. ``src_blocks`` are
    the source's blocks by position (``None``: none held there), ``dst_blocks`` the
    destination's (``None``: nothing to land there), each side of its own tokens per block;
    a destination block is missing when a token of it below ``tokens`` has no source block."""
    return _hixl.plan_token_blocks(_opt_ints("src_blocks", src_blocks),
                                   _opt_ints("dst_blocks", dst_blocks),
                                   _int("tokens", tokens),
                                   _int("src_block_tokens", src_block_tokens, 1),
                                   _int("dst_block_tokens", dst_block_tokens, 1))


def _opt_ints(name: str, values: Any) -> List[Optional[int]]:
    if not isinstance(values, (list, tuple)):
        raise _type_error(f"{name} must be a list of ints or None, got {type(values).__name__}")
    return [None if v is None else _int(f"{name}[{i}]", v) for i, v in enumerate(values)]


def _grants(grants: Any) -> List[str]:
    """A list of lease grants (as :meth:`CacheManager.pull_leased_blocks` takes each), as
    JSON."""
    if not isinstance(grants, (list, tuple)):
        raise _type_error(f"grants must be a list of lease grants, got {grants!r}")
    return [_grant(g).to_json() for g in grants]


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _type_error(f"{name} must be a bool, got {value!r}")
    return value


def _keys(src_cache_keys: Any) -> List[BlocksCacheKey]:
    if not isinstance(src_cache_keys, (list, tuple)) or not all(
            isinstance(k, BlocksCacheKey) for k in src_cache_keys):
        raise _type_error(f"src_cache_keys must be a list of BlocksCacheKey, got "
                          f"{src_cache_keys!r}")
    return list(src_cache_keys)


class _Reshard(_Manager):
    """Heterogeneous tensor parallelism."""

    def set_kv_shard(self, cache: Cache, tp_rank: int, tp_size: int, total_heads: int,
                     head_dim: int, layout: str = "NHD", mla: bool = False) -> None:
        """hixl extension: declares which KV heads ``cache`` holds (rank ``tp_rank`` of a TP
        group of ``tp_size`` over ``total_heads`` heads of ``head_dim`` elements). Its shape is
        ``[blocks, tokens, heads, head_dim]`` (``"NHD"``), ``[blocks, heads, tokens, head_dim]``
        (``"HND"``; ``"HND_KV"`` where each head holds its tokens' K rows then their V rows,
        ``head_dim`` counting both, as vLLM's CPU attention), or ``[blocks, tokens, latent]``
        for ``mla``. Peers see it at link time."""
        self._check()
        c = self._registered("cache", cache)
        if not isinstance(layout, str):
            raise _type_error(f"layout must be \"NHD\", \"HND\" or \"HND_KV\", got {layout!r}")
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
        keys = _keys(src_cache_keys)
        dst = self._registered("dst_cache", dst_cache)
        ext = _kw("pull_kv_blocks_resharded", kwargs)
        self._native.pull_resharded([k._tuple() for k in keys], dst.cache_id,
                                    _ints("src_blocks", src_blocks),
                                    _ints("dst_blocks", dst_blocks), ext)

    def pull_leased_blocks_resharded(self, grants: Sequence[Union[LeaseGrant, Dict[str, Any], str]],
                                     src_cache_keys: Sequence[BlocksCacheKey], dst_cache: Cache,
                                     src_blocks: Sequence[int], dst_blocks: Sequence[int],
                                     done: bool = True, **kwargs: Any) -> None:
        """hixl extension: :meth:`pull_kv_blocks_resharded` under the prefill ranks' leases:
        ``grants[i]`` (a grant as :meth:`pull_leased_blocks` takes it) is the lease of the
        prefill rank whose blocks cache is ``src_cache_keys[i]``, each granted by that rank
        with :meth:`lease_blocks`. The leases of the ranks this decode rank reads
        (:func:`kv_shard_sources`) are taken before a byte moves, each declaring how many decode
        ranks read that prefill rank (:func:`kv_shard_readers`); with ``done`` each is given
        back done once the pull landed, and a prefill rank's lease ends ``DONE`` when every
        decode rank reading it did so. A lease that is not live: ``LLM_LEASE_ENDED`` and
        nothing moves. Keyword arguments and partial failures as :meth:`pull_blocks`."""
        self._check()
        gs = _grants(grants)
        keys = _keys(src_cache_keys)
        dst = self._registered("dst_cache", dst_cache)
        ext = _kw("pull_leased_blocks_resharded", kwargs)
        self._native.pull_leased_resharded(gs, [k._tuple() for k in keys], dst.cache_id,
                                           _ints("src_blocks", src_blocks),
                                           _ints("dst_blocks", dst_blocks), ext,
                                           _bool("done", done))

    def pull_kv_tokens(self, src_cache_keys: Sequence[BlocksCacheKey], dst_cache: Cache,
                       src_blocks: Sequence[Optional[int]], dst_blocks: Sequence[Optional[int]],
                       tokens: int, **kwargs: Any) -> None:
        """hixl extension: pulls a request's tokens into ``dst_cache`` whatever each side's
        tokens per block: ``src_blocks`` are the prefill's blocks by position (``None`` where
        it holds none), ``dst_blocks`` this cache's blocks by position (``None`` where nothing
        is to land), ``tokens`` the request's tokens (rows past it are not moved). Each token
        of each head lands at its place, across TP sizes as
        :meth:`pull_kv_blocks_resharded` (both caches need a shard). Blocks that cannot land
        (:func:`plan_token_blocks`) are left untouched. Keyword arguments and failures as
        :meth:`pull_blocks`."""
        self._check()
        keys = _keys(src_cache_keys)
        dst = self._registered("dst_cache", dst_cache)
        ext = _kw("pull_kv_tokens", kwargs)
        self._native.pull_tokens([k._tuple() for k in keys], dst.cache_id,
                                 _opt_ints("src_blocks", src_blocks),
                                 _opt_ints("dst_blocks", dst_blocks), _int("tokens", tokens),
                                 ext)

    def pull_leased_kv_tokens(self, grants: Sequence[Union[LeaseGrant, Dict[str, Any], str]],
                              src_cache_keys: Sequence[BlocksCacheKey], dst_cache: Cache,
                              src_blocks: Sequence[Optional[int]],
                              dst_blocks: Sequence[Optional[int]], tokens: int,
                              done: bool = True, **kwargs: Any) -> None:
        """hixl extension: :meth:`pull_kv_tokens` under the prefill ranks' leases, as
        :meth:`pull_leased_blocks_resharded` (each grant covers every block of
        ``src_blocks``)."""
        self._check()
        gs = _grants(grants)
        keys = _keys(src_cache_keys)
        dst = self._registered("dst_cache", dst_cache)
        ext = _kw("pull_leased_kv_tokens", kwargs)
        self._native.pull_leased_tokens(gs, [k._tuple() for k in keys], dst.cache_id,
                                        _opt_ints("src_blocks", src_blocks),
                                        _opt_ints("dst_blocks", dst_blocks),
                                        _int("tokens", tokens), ext, _bool("done", done))
