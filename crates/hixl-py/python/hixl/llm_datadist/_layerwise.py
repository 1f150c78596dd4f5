"""``CacheManager.transfer_cache_async``: a cache pushed layer by layer while the model
computes the next layer."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ._status import LLMException, LLMStatusCode, _native_error, _type_error, _value_error
from ._manager import _Manager
from ._types import (BlocksCacheKey, Cache, CacheTask, LayerSynchronizer, TransferConfig,
                     TransferWithCacheKeyConfig, _int, _ints)

_S = LLMStatusCode


class _Layerwise(_Manager):
    """Layer-wise transfers."""

    def transfer_cache_async(
            self, src_cache: Cache, layer_synchronizer: LayerSynchronizer,
            transfer_configs: Union[List[Union[TransferConfig, TransferWithCacheKeyConfig]],
                                    Tuple[Union[TransferConfig, TransferWithCacheKeyConfig], ...]],
            src_block_indices: Optional[Sequence[int]] = None,
            dst_block_indices: Optional[Sequence[int]] = None,
            dst_block_memory_size: Optional[int] = None) -> CacheTask:
        """Pushes ``src_cache`` layer by layer to every config's destination, each layer as soon
        as ``layer_synchronizer.synchronize_layer(layer, None)`` returned True; returns a
        :class:`CacheTask` at once. Layer ``l`` moves while the synchronizer waits for layer
        ``l + 1``. With block indices, blocks ``src_block_indices`` go to
        ``dst_block_indices`` of a blocks destination; without, batch entry
        ``src_batch_index`` goes to the destination entry.

        ``synchronize_layer`` runs on the task's own thread; if it returns False (or raises),
        the configs waiting for that layer report ``LLM_PARAM_INVALID`` and the task stops.
        hixl pushes host caches (the real package requires device ones).
        """
        self._check()
        src = self._registered("src_cache", src_cache)
        if not isinstance(layer_synchronizer, LayerSynchronizer) and not callable(
                getattr(layer_synchronizer, "synchronize_layer", None)):
            raise _type_error(f"layer_synchronizer must be a LayerSynchronizer, got "
                              f"{layer_synchronizer!r}")
        if not isinstance(transfer_configs, (list, tuple)) or not transfer_configs:
            raise _type_error("transfer_configs must be a non-empty list of TransferConfig or "
                              "TransferWithCacheKeyConfig")
        sb = _ints("src_block_indices", src_block_indices)
        db = _ints("dst_block_indices", dst_block_indices)
        desc = src.cache_desc
        stride = desc.size // desc.batch_size
        if sb or db:
            if not sb or not db:
                raise LLMException(
                    "transfer_cache_async between a contiguous cache and blocks is not supported "
                    "by hixl: give both src_block_indices and dst_block_indices, or neither",
                    _S.LLM_FEATURE_NOT_ENABLED)
            if len(sb) != len(db):
                raise _value_error(f"{len(sb)} src_block_indices but {len(db)} "
                                   "dst_block_indices")
        if dst_block_memory_size not in (None, 0):
            m = _int("dst_block_memory_size", dst_block_memory_size)
            if not db or m != stride:
                raise _value_error(f"dst_block_memory_size {m}: hixl pushes blocks of the "
                                   f"source's size ({stride} bytes) into blocks of that size")
        if desc.num_tensors % 2:
            raise _value_error(f"cache {src.cache_id} has {desc.num_tensors} tensors: a "
                               "layer-wise transfer needs two per layer")
        num_layers = desc.num_tensors // 2
        specs, plans = [], []
        for i, cfg in enumerate(transfer_configs):
            spec, src_range, dst_start = self._plan(i, cfg, num_layers, sb, db, stride)
            specs.append(spec)
            plans.append((src_range, dst_start))
        task = self._native.layer_task(src.cache_id, specs)
        n = len(specs)
        results: List[Optional[LLMStatusCode]] = [None] * n
        errors: List[Optional[LLMException]] = [None] * n

        def drive() -> None:
            refused: Dict[int, LLMException] = {}
            sent = [0] * n
            try:
                for layer in range(num_layers):
                    to = [j for j in range(n) if plans[j][0].start <= layer < plans[j][0].stop
                          and j not in refused and not task.failed(j)]
                    if not to:
                        continue
                    try:
                        ok = layer_synchronizer.synchronize_layer(layer, None)
                        why = f"synchronize_layer({layer}) returned {ok!r}"
                    except Exception as e:  # the user's code: report it on the configs
                        ok, why = False, f"synchronize_layer({layer}) raised {e!r}"
                    if not ok:
                        for j in to:
                            refused[j] = LLMException(why, _S.LLM_PARAM_INVALID)
                        break
                    for j in to:
                        src_range, dst_start = plans[j]
                        try:
                            if task.send(j, layer, dst_start + layer - src_range.start):
                                sent[j] += 1
                        except LLMException as e:
                            refused.setdefault(j, e)
            finally:
                outcomes = task.wait()
                for j in range(n):
                    if j in refused:
                        errors[j] = refused[j]
                    else:
                        out = outcomes[j]
                        if out is not None:
                            errors[j] = _native_error(*out)
                    err = errors[j]
                    if err is not None:
                        results[j] = err.status_code
                    elif sent[j] == len(plans[j][0]):
                        results[j] = _S.LLM_SUCCESS

        t = threading.Thread(target=drive, name="hixl-transfer-cache", daemon=True)
        t.start()
        return CacheTask(t, n, results, errors)

    def _plan(self, i: int, cfg: Any, num_layers: int, sb: List[int], db: List[int],
              stride: int) -> Tuple[Tuple[Any, ...], range, int]:
        """The native target of config ``i``, its source layers and first destination layer."""
        if not isinstance(cfg, (TransferConfig, TransferWithCacheKeyConfig)):
            raise _type_error(f"transfer_configs[{i}] must be a TransferConfig or "
                              f"TransferWithCacheKeyConfig, got {cfg!r}")
        src_range = cfg.src_layer_range if cfg.src_layer_range is not None \
            else range(0, num_layers)
        if src_range.stop > num_layers:
            raise _value_error(f"transfer_configs[{i}]: src_layer_range {src_range!r} is past "
                               f"the source's {num_layers} layers")
        nl = len(src_range)
        blocks = bool(sb)
        if isinstance(cfg, TransferWithCacheKeyConfig):
            dst_range = cfg.dst_layer_range if cfg.dst_layer_range is not None else src_range
            if len(dst_range) != nl:
                raise _value_error(f"transfer_configs[{i}]: src_layer_range {src_range!r} and "
                                   f"dst_layer_range {dst_range!r} differ in length")
            key = cfg.cache_key
            if isinstance(key, BlocksCacheKey):
                if not blocks:
                    raise _value_error(f"transfer_configs[{i}]: a BlocksCacheKey destination "
                                       "needs src_block_indices and dst_block_indices")
                if dst_range.start == src_range.start:
                    spec = (0, key.cluster_id, key.model_id, 0, sb, db, 0, 2)
                else:
                    cid = self._remote_id_by_key(key)
                    spec = (2, key.cluster_id, cid, 0, sb, db, 0, 2)
            elif blocks:
                spec = (2, key.cluster_id, key.cache_id, 0, sb, db, 0, 2)
            else:
                spec = (1, key.cluster_id, key.cache_id, key.batch_index, [], [],
                        cfg.src_batch_index, 2)
            return spec, src_range, dst_range.start
        # TransferConfig: find the peer's cache holding dst_addrs.
        if len(cfg.dst_addrs) != 2 * nl:
            raise _value_error(f"transfer_configs[{i}]: {len(cfg.dst_addrs)} dst_addrs for "
                               f"{nl} layers (two per layer expected)")
        cid, rkey, t0, entry = self._remote_by_addrs(i, cfg.dst_cluster_id, cfg.dst_addrs)
        if t0 % 2:
            raise _value_error(f"transfer_configs[{i}]: dst_addrs[0] is tensor {t0} of the "
                               "peer's cache, not the first tensor of a layer")
        if blocks:
            if entry != 0:
                raise _value_error(f"transfer_configs[{i}]: with block indices, dst_addrs must "
                                   "be the peer's tensor addresses (offset 0)")
            if rkey is not None and t0 // 2 == src_range.start:
                # same layers on both sides: block runs move as one piece per tensor
                spec = (0, rkey[0], rkey[1], 0, sb, db, 0, 2)
            else:
                spec = (2, cfg.dst_cluster_id, cid, 0, sb, db, 0, 2)
        else:
            spec = (1, cfg.dst_cluster_id, cid, entry, [], [], cfg.src_batch_index, 2)
        return spec, src_range, t0 // 2

    def _remote_id_by_key(self, key: BlocksCacheKey) -> int:
        for cid, k, _nt, _units, _stride, _addrs in self._native.peer_caches(key.cluster_id):
            if k == key._tuple():
                return cid
        raise LLMException(f"blocks cache {key!r} does not exist", _S.LLM_KV_CACHE_NOT_EXIST)

    def _remote_by_addrs(self, i: int, cluster_id: int, dst_addrs: List[int]
                         ) -> Tuple[int, Optional[Tuple[int, int]], int, int]:
        """``(cache_id, key, first tensor, batch entry)`` of the peer's cache ``dst_addrs``
        name."""
        for cid, key, nt, units, stride, addrs in self._native.peer_caches(cluster_id):
            size = units * stride
            a0 = dst_addrs[0]
            for t0, base in enumerate(addrs):
                if not base <= a0 < base + size:
                    continue
                off = a0 - base
                if off % stride:
                    break
                if t0 + len(dst_addrs) > nt:
                    break
                if all(dst_addrs[k] == addrs[t0 + k] + off for k in range(len(dst_addrs))):
                    return cid, key, t0, off // stride
                break
        raise LLMException(f"transfer_configs[{i}]: dst_addrs {[hex(a) for a in dst_addrs[:2]]}"
                           f"... are not the tensors of a cache cluster {cluster_id} registered",
                           _S.LLM_KV_CACHE_NOT_EXIST)
