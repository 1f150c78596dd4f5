"""The connector's worker half (Worker process): registers the KV caches, creates the
prefill's leases, pulls on the decode, and reports what finished and what failed to load."""

from __future__ import annotations

import functools
import json
import secrets
import threading
import time
from concurrent.futures import ALL_COMPLETED, ThreadPoolExecutor, wait
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ..llm_datadist import (BlocksCacheKey, CacheDesc, DataType, LLMClusterInfo, LLMConfig,
                            LLMDataDist, LLMException, LLMRole, LLMStatusCode, Placement)
from ..llm_datadist import kv_shard_readers, kv_shard_sources
from .. import _netconf
from ._common import HixlConnectorMetadata, HixlHandshakeMetadata, _Pull, _trace, logger
from ._geometry import group_pairs, mismatch, missing_blocks, token_maps, token_plans
from ._register import Layout, register
from ._stages import layer_runs, stages, uncovered
from ._stats import HixlKVConnectorStats


def _addr(host: str) -> str:
    """``host`` as the host part of ``host:port`` (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class _Worker:
    def __init__(self, vllm_config: Any, kv_cache_config: Any, extra: Dict[str, Any]) -> None:
        self.extra = extra
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        try:
            from vllm.distributed.parallel_state import (  # type: ignore
                get_tensor_model_parallel_rank)
            self.tp_rank = int(get_tensor_model_parallel_rank())
        except Exception:  # not initialised in a single-process test
            self.tp_rank = 0
        self.tp_size = int(vllm_config.parallel_config.tensor_parallel_size)
        self.pp_size = int(getattr(vllm_config.parallel_config, "pipeline_parallel_size", 1)
                           or 1)
        try:
            from vllm.distributed.parallel_state import get_pp_group
            self.pp_rank = int(get_pp_group().rank_in_group)
        except Exception:  # not initialised in a single-process test
            self.pp_rank = 0
        self.cluster_id = secrets.randbits(62) + 1
        role = vllm_config.kv_transfer_config.kv_role
        dd_role = {"kv_producer": LLMRole.PROMPT, "kv_consumer": LLMRole.DECODER}.get(
            role, LLMRole.MIX)
        self.dd = LLMDataDist(dd_role, self.cluster_id)
        cfg = LLMConfig()
        rank = self._local_rank()
        cfg.listen_ip_info = f"{_addr(extra['host'])}:{_netconf.listen_port(extra, rank)}"
        opts = cfg.generate_options()
        opts.update(_netconf.engine_options(extra))
        #: the name this worker publishes in the directory ("" without one)
        self.name = ""
        if extra.get("directory"):
            base = extra.get("name") or str(vllm_config.kv_transfer_config.engine_id)
            side = {"kv_producer": "p", "kv_consumer": "d"}.get(role, "pd")
            self.name = f"{base}-{side}-{rank}"
            opts["hixl.Name"] = self.name
        self.dd.init(opts)
        self.cm = self.dd.cache_manager
        host, _, port = self.dd.listen_ip_info.rpartition(":")
        self.host, self.port = host, int(port)
        self.cache: Any = None
        self.layout: Optional[Layout] = None
        #: prefill engines whose compatibility record was refused (logged once each)
        self.refused: Set[str] = set()
        #: the compatibility verdict per prefill record and TP size (None: compatible)
        self.verdicts: Dict[str, Optional[str]] = {}
        self.tensors: List[Any] = []
        self.block_bytes = 0
        self.num_blocks = 0
        self.per_layer = 1
        self.n_tensors = 0
        # Host-buffer mode (KV caches on an accelerator): the registered memory is a host copy
        # of the caches' layout, filled from the device before a lease and copied to the
        # device after a pull, with vLLM's block-copy op (`set_host_xfer_buffer_ops`).
        self.device_caches: Optional[Dict[str, Any]] = None
        self.host_caches: Dict[str, Any] = {}
        self.block_dim: Dict[str, int] = {}
        self.copy_blocks: Any = None
        self.lock = threading.Lock()
        #: prefill workers linked to, by cluster id: the transport of the link
        self.transports: Dict[int, str] = {}
        self.link_locks: Dict[int, threading.Lock] = {}
        # Pulls wait mostly on the prefill's answers, so several overlap even on one core.
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="hixl-pull")
        self.pulls: Dict[str, _Pull] = {}
        self.lease_req: Dict[int, str] = {}
        self.sending_done: Set[str] = set()
        self.load_errors: Set[int] = set()
        self.failed_reqs: Set[str] = set()
        self.stats = HixlKVConnectorStats()
        self.closed = False

    # -------------------------------------------------------------- start-up
    def _local_rank(self) -> int:
        """This worker's rank among the server's workers on this host (its fixed port is
        ``port`` + this): vLLM's local rank, else its TP rank."""
        try:
            from vllm.distributed.parallel_state import get_world_group
            return int(get_world_group().local_rank)
        except Exception:  # not initialised in a single-process test
            return self.tp_rank

    def register(self, kv_caches: Dict[str, Any]) -> None:
        """Registers the layers' KV tensors as one blocks cache (``_register``); in
        host-buffer mode, host copies of them."""
        on_device = sorted({str(t.device) for t in kv_caches.values() if t.device.type != "cpu"})
        staged = self.extra.get("host_buffer")
        if staged is None:
            staged = bool(on_device)
        if on_device and not staged:
            raise RuntimeError(f"hixl.vllm: KV caches on {on_device} with host_buffer = false: "
                               "hixl moves host memory; let it stage through host buffers")
        if staged:
            import torch  # type: ignore  # vLLM's own dependency
            self.device_caches = dict(kv_caches)
            self.host_caches = {name: torch.empty(tuple(t.shape), dtype=t.dtype, device="cpu")
                                for name, t in kv_caches.items()}
            kv_caches = self.host_caches
            logger.info("hixl: host-buffer mode: %d KV tensors%s staged through host memory",
                        len(kv_caches), f" on {on_device}" if on_device else "")
        lay = register(self.dd, self.cluster_id, kv_caches, self.kv_cache_config,
                       self.vllm_config, self.tp_rank, self.tp_size)
        self.layout, self.cache, self.block_dim = lay, lay.cache, lay.block_dim
        self.block_bytes, self.num_blocks, self.per_layer = (lay.block_bytes, lay.num_blocks,
                                                             lay.per_layer)
        self.n_tensors = lay.n_tensors
        self.tensors = list(kv_caches.values())
        logger.info("hixl: registered %d KV tensors of %d blocks x %d B (%s, %d group(s)); "
                    "listening on %s:%d", lay.n_tensors, lay.num_blocks, lay.block_bytes,
                    lay.compat["layout"], len(lay.groups), self.host, self.port)

    def handshake(self) -> Optional[HixlHandshakeMetadata]:
        if self.cache is None:
            return None
        return HixlHandshakeMetadata(host=self.host, port=self.port, name=self.name,
                                     cluster_id=self.cluster_id,
                                     cache_id=int(self.cache.cache_id),
                                     num_blocks=self.num_blocks, block_bytes=self.block_bytes,
                                     tensors=self.n_tensors, tp_rank=self.tp_rank,
                                     tp_size=self.tp_size,
                                     compat=dict(self.layout.compat) if self.layout else {},
                                     pp_rank=self.pp_rank, pp_size=self.pp_size,
                                     layers=[[f, list(ids)] for f, ids in self.layout.layers]
                                     if self.layout else [])

    # -------------------------------------------------------------- per step
    def on_meta(self, meta: HixlConnectorMetadata) -> None:
        for req_id, grants in meta.to_lease.items():
            w = self.pp_rank * self.tp_size + self.tp_rank
            g = grants[w] if w < len(grants) else None
            if g is None or g["owner"] != self.cluster_id:
                logger.error("hixl: lease of request %s names owner %s, this worker is %d: "
                             "its blocks are freed at once", req_id,
                             None if g is None else g["owner"], self.cluster_id)
                self.sending_done.add(req_id)
                continue
            try:
                # The request's KV is complete (its prefill finished last step): in
                # host-buffer mode it goes to the registered host copy before anyone may pull.
                self._stage("d2h", [int(b) for b in g["blocks"]])
                self.cm.lease_blocks(g["request_id"], [self.cache], g["blocks"], g["ttl_ms"],
                                     lease_id=g["lease_id"], generation=g["generation"])
                self.lease_req[int(g["lease_id"])] = req_id
                _trace("leased", req_id)
            except Exception as e:  # never out of vLLM's step: this request fails alone
                logger.error("hixl: could not lease the blocks of request %s (%s): they are "
                             "freed at once and the decode's pull will be refused", req_id, e)
                self.sending_done.add(req_id)
        for req_id, (local, p) in meta.to_recv.items():
            _trace("submit", req_id)
            self.pulls[req_id] = _Pull(self.pool.submit(self._pull, req_id, local, p),
                                       time.perf_counter(), [b for g in local for b in g])
        for req_id, p in meta.to_drop.items():
            self.pool.submit(self._drop, req_id, p)

    def _plan(self, h: Dict[str, Any]) -> List[int]:
        """The prefill ranks this decode rank reads, after checking the prefill's
        compatibility record against this worker's: a mismatch raises ``LLM_PARAM_INVALID``
        naming both values (logged once per prefill engine), before anything is linked."""
        ptp = int(h.get("tp_size", 1))
        # A prefill engine's record is the same for each of its requests: judged once.
        key = json.dumps([h.get("compat"), ptp], sort_keys=True)
        if key not in self.verdicts:
            self.verdicts[key] = mismatch(self.layout.compat if self.layout else {},
                                          h.get("compat") or {}, self.tp_size, ptp)
        why = self.verdicts[key]
        if why is not None:
            engine = str(h.get("engine_id", "?"))
            if engine not in self.refused:
                self.refused.add(engine)
                logger.error("hixl: refusing to pull from prefill engine %s: %s", engine, why)
            raise LLMException(f"refused: {why}", LLMStatusCode.LLM_PARAM_INVALID)
        if ptp == self.tp_size:
            return [self.tp_rank]
        return kv_shard_sources(self.tp_rank, self.tp_size, ptp, int(h["compat"]["kv_heads"]),
                                mla=h["compat"]["layout"] == "MLA")

    def _link(self, rank: Dict[str, Any]) -> None:
        cid = int(rank["cluster_id"])
        with self.lock:
            if cid in self.transports:
                return
            lk = self.link_locks.setdefault(cid, threading.Lock())
        with lk:
            if cid in self.transports:
                return
            where = f"prefill worker {rank['host']}:{rank['port']}"
            try:
                _netconf.check_peer_address(self.host, str(rank["host"]), where)
            except ValueError as e:
                if where not in self.refused:
                    self.refused.add(where)
                    logger.error("hixl: refusing to pull: %s", e)
                raise LLMException(f"refused: {e}", LLMStatusCode.LLM_PARAM_INVALID) from None
            info = LLMClusterInfo()
            info.remote_cluster_id = cid
            if self.name and rank.get("name"):
                # both sides publish in the directory: the link goes by name (it follows a
                # restarted prefill to its new address, and checks its incarnation)
                info.remote_name = str(rank["name"])
                where = f"prefill worker {rank['name']}"
            else:
                info.append_remote_ip_info(str(rank["host"]), int(rank["port"]))
            _, rets = self.dd.link_clusters([info], int(self.extra["link_timeout_ms"]))
            if rets[0] not in (LLMStatusCode.LLM_SUCCESS, LLMStatusCode.LLM_ALREADY_LINK):
                raise LLMException(f"link to {where} (cluster {cid}) failed: {rets[0]!r}",
                                   rets[0])
            try:
                how = self.dd.link_transport(cid)
            except LLMException as e:
                how = f"? ({e})"
            self.transports[cid] = how.split()[0]
            logger.info("hixl: linked to %s (cluster %d) over %s", where, cid, how)

    def _pull(self, req_id: str, local: List[List[int]],
              p: Dict[str, Any]) -> Tuple[Set[int], Optional[str]]:
        """Runs on a pool thread (the native calls release the GIL). ``local``: the request's
        new local blocks per KV cache group. Returns the local blocks that did not land, and
        why. One pull per group (its layers, its blocks), the lease ended with the last; from
        the same TP size a plain leased pull of this rank's peer, else a resharded one of the
        prefill ranks holding this rank's heads."""
        t0 = time.perf_counter()
        _trace("start", req_id)
        h = p["hixl"]
        everything = {b for g in local for b in g}
        try:
            sources = self._plan(h)
            remote = h["remote_block_ids"]
            if len(remote) != len(local):
                raise LLMException(f"refused: the prefill has {len(remote)} KV cache groups, "
                                   f"this decode {len(local)}", LLMStatusCode.LLM_PARAM_INVALID)
            pos = p["pos"]
            if len(pos) != len(local) or any(len(a) != len(b) for a, b in zip(pos, local)):
                raise ValueError(f"{len(pos)} position lists for {len(local)} block lists")
            pbs = int(h["compat"]["block_size"])
            dbs = int(self.layout.compat["block_size"]) if self.layout else pbs
            pairs: List[Tuple[List[Any], List[Any]]]
            plans: List[Tuple[List[int], List[int]]] = []
            tokens = 0
            if pbs != dbs:
                # Different block sizes: each token lands at its place (see _geometry).
                pairs = list(token_maps(remote, local, pos))
                tokens = int(h.get("tokens") or max(len(s) for s in remote) * pbs)
                plans = token_plans(pairs, tokens, pbs, dbs)
                landing = {b for ok, _ in plans for b in ok}
                missing = {b for _, bad in plans for b in bad}
            else:
                pairs = list(group_pairs(remote, local, pos))
                landing = {int(b) for _, dst in pairs for b in dst}
                missing = set(missing_blocks(remote, local, pos))
            todo = [g for g, sd in enumerate(pairs) if (plans[g][0] if pbs != dbs else sd[1])]
            t1, ranks = t0, []
            for sranks, sgrants, layer_ranges in self._stages_read(h):
                grants = [sgrants[r] for r in sources]
                ranks = [sranks[r] for r in sources]
                for rank in ranks:
                    self._link(rank)
                keys = [BlocksCacheKey(int(r["cluster_id"]), 0) for r in ranks]
                calls = [(g, a, b) for g in todo for a, b in layer_ranges[g]]
                for i, (g, lr_src, lr_dst) in enumerate(calls):
                    src, dst = pairs[g]
                    kw = {"tensor_num_per_layer": self.per_layer, "src_layer_range": lr_src,
                          "dst_layer_range": lr_dst}
                    last = i == len(calls) - 1
                    if pbs != dbs:
                        call = (lambda src=src, dst=dst, last=last, kw=kw, grants=grants,
                                keys=keys: self.cm.pull_leased_kv_tokens(
                                    grants, keys, self.cache, src, dst, tokens, done=last,
                                    **kw))
                    elif len(sources) == 1 and int(h.get("tp_size", 1)) == self.tp_size:
                        call = (lambda src=src, dst=dst, last=last, kw=kw, grants=grants,
                                keys=keys: self.cm.pull_leased_blocks(
                                    grants[0], keys[0], self.cache, src_blocks=src,
                                    dst_blocks=dst, done=last, **kw))
                    else:
                        call = (lambda src=src, dst=dst, last=last, kw=kw, grants=grants,
                                keys=keys: self.cm.pull_leased_blocks_resharded(
                                    grants, keys, self.cache, src, dst, done=last, **kw))
                    started = self._until_leased(t0, call)
                    if t1 == t0:  # the post time ends when the first pull went through
                        t1 = started
                if not calls:
                    for grant in grants:
                        self.cm.lease_done(grant)
                self._unread(h, sranks, sgrants)
            t2 = time.perf_counter()
            _trace("pulled", req_id)
            runs = len(landing) if pbs != dbs else sum(
                1 for g in todo for j in range(len(pairs[g][0]))
                if j == 0 or pairs[g][0][j] != pairs[g][0][j - 1] + 1
                or pairs[g][1][j] != pairs[g][1][j - 1] + 1)
            with self.lock:
                self.stats.record(t1 - t0, t2 - t1,
                                  len(landing) * self.block_bytes * self.n_tensors,
                                  runs * self.n_tensors * len(sources),
                                  self.transports.get(int(ranks[0]["cluster_id"]), "?")
                                  if ranks else "?")
            return missing, ("the prefill holds fewer blocks" if missing else None)
        except LLMException as e:
            if e.status_code not in (LLMStatusCode.LLM_LEASE_ENDED,
                                     LLMStatusCode.LLM_PARAM_INVALID):
                # The link may be dead (the prefill died or the network broke): the next pull
                # from this prefill links again instead of failing on it.
                self._forget(h)
            failed = {dst_b for (_, _, _, dst_b) in e.failed_blocks} if e.failed_blocks \
                else everything
            with self.lock:
                self.stats.data["num_failed_transfers"].append(1)
            return failed, f"{e.status_code.name}: {e}"
        except Exception as e:  # a malformed parameter set: nothing moved
            return everything, f"{type(e).__name__}: {e}"

    def _stages_read(self, h: Dict[str, Any]) -> List[Tuple[List[Dict[str, Any]],
                                                         List[Dict[str, Any]],
                                                         List[List[Tuple[range, range]]]]]:
        """The prefill stages this worker reads: each stage's ranks, grants, and per KV cache
        group the (prefill, decode) layer ranges it gives. Without PP on either side, the one
        stage and each group's own layers; a stage layout that does not cover this worker's
        layers is refused (``LLM_PARAM_INVALID``) naming the layers."""
        st = stages(h)
        groups = self.layout.groups if self.layout else [(0, 1)]
        if len(st) == 1 and self.pp_size == 1:
            whole = [[(range(f, f + n), range(f, f + n))] for f, n in groups]
            return [(st[0][0], st[0][1], whole)]
        mine = self.layout.layers if self.layout else []
        held = [[(int(f), [int(x) for x in ids]) for f, ids in sranks[0].get("layers") or []]
                for sranks, _ in st]
        why = uncovered(mine, held)
        if why is not None:
            raise LLMException(f"refused: {why}", LLMStatusCode.LLM_PARAM_INVALID)
        out = []
        for (sranks, sgrants), layers in zip(st, held):
            runs = [layer_runs(layers[g], mine[g]) for g in range(len(mine))]
            if any(runs):
                out.append((sranks, sgrants, runs))
        return out

    def _unread(self, h: Dict[str, Any], ranks: List[Dict[str, Any]],
                grants: List[Dict[str, Any]]) -> None:
        """Decode rank 0 ends the leases of a stage's prefill ranks no decode rank reads
        (replicas of heads when the prefill's TP exceeds its KV heads), so their blocks are
        freed now, not when the leases expire."""
        ptp = int(h.get("tp_size", 1))
        if self.tp_rank != 0 or ptp == self.tp_size:
            return
        c = h["compat"]
        readers = kv_shard_readers(self.tp_size, ptp, int(c["kv_heads"]),
                                   mla=c["layout"] == "MLA")
        for r, n in enumerate(readers):
            if n == 0:
                try:
                    self._link(ranks[r])
                    self.cm.lease_done(grants[r])
                except LLMException as e:
                    logger.info("hixl: could not end the lease of unread prefill rank %d (%s); "
                                "it expires instead", r, e)

    def _until_leased(self, since: float, call: Callable[[], None]) -> float:
        """Runs `call`, again while the prefill refuses it before a byte moved because the
        lease does not exist yet (its worker creates it one step after the grant was handed
        out), for up to ``lease_wait_ms`` after `since`. Returns when the attempt that went
        through started; raises the last refusal or any other error."""
        deadline = since + self.extra["lease_wait_ms"] / 1e3
        while True:
            started = time.perf_counter()
            try:
                call()
                return started
            except LLMException as e:
                if (e.status_code != LLMStatusCode.LLM_LEASE_ENDED or e.failed_blocks
                        or time.perf_counter() >= deadline):
                    raise
            time.sleep(0.001)

    def _forget(self, h: Dict[str, Any]) -> None:
        """Drops the links to the prefill workers of ``h`` (the next pull links again)."""
        try:
            cids = [int(r["cluster_id"]) for r in h["ranks"]]
        except (KeyError, TypeError, ValueError):
            return
        for cid in cids:
            with self.lock:
                if self.transports.pop(cid, None) is None:
                    continue
            info = LLMClusterInfo()
            info.remote_cluster_id = cid
            try:
                self.dd.unlink_clusters([info], 1000, force=True)
            except Exception:  # best effort: the link is being dropped anyway
                pass

    def _drop(self, req_id: str, p: Dict[str, Any]) -> None:
        h = p["hixl"]
        try:
            sources = self._plan(h)
            for sranks, sgrants, _ in self._stages_read(h):
                for r in sources:
                    self._link(sranks[r])
                    self._until_leased(time.perf_counter(),
                                       functools.partial(self.cm.lease_done, sgrants[r]))
                self._unread(h, sranks, sgrants)
        except Exception as e:
            logger.info("hixl: could not tell the prefill that request %s needs its blocks "
                        "no more (%s); its lease expires instead", req_id, e)

    def finished(self) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        sending = self.sending_done
        self.sending_done = set()
        try:
            # Only a worker waiting on leases it made asks for their ends: a decode (or an
            # idle prefill) makes no native call here, every engine step.
            for ev in (self.cm.lease_events(0) if self.lease_req else ()):
                req_id = self.lease_req.pop(int(ev.lease_id), None)
                if req_id is None:
                    continue
                if ev.why == "EXPIRED":
                    logger.warning("hixl: KV lease expired for request %s: no decode pulled "
                                   "its blocks within the lease; they are freed", req_id)
                    with self.lock:
                        self.stats.data["num_kv_expired_reqs"].append(1)
                sending.add(req_id)
                _trace("lease-ended", req_id)
        except LLMException as e:
            logger.error("hixl: lease events: %s", e)
        recving: Set[str] = set()
        # A pull younger than `wait_ms` is waited for here, so that it is reported in the step
        # that started it rather than the next one (a step is ~1 ms or a forward's time);
        # an older one is only polled, so a slow peer cannot stall the other requests.
        now = time.perf_counter()
        budget = self.extra["wait_ms"] / 1e3
        young = [p for p in self.pulls.values()
                 if not p.future.done() and now - p.started < budget]
        if young:
            left = max(p.started for p in young) + budget - now
            wait([p.future for p in young], timeout=max(0.0, left), return_when=ALL_COMPLETED)
        for req_id, pull in list(self.pulls.items()):
            if pull.future.done():
                del self.pulls[req_id]
                local = pull.local
                failed, why = pull.future.result()
                landed = [b for b in local if b not in failed]
                if landed:
                    try:
                        # host-buffer mode: the pulled blocks go to the device before vLLM
                        # is told they are there
                        self._stage("h2d", landed)
                    except Exception as e:  # the device copy failed: nothing is usable
                        failed = set(local)
                        why = f"copying the pulled blocks to the device: {e}"
                if failed:
                    logger.warning("hixl: KV load failure for request %s: blocks %s did not "
                                   "land (%s)", req_id, sorted(failed), why)
                    if self.layout is not None and len(self.layout.groups) > 1:
                        # Block ids are per group: vLLM takes such failures per request
                        # (and recomputes or fails the request as its policy says).
                        self.failed_reqs.add(req_id)
                    else:
                        self.load_errors |= failed
                recving.add(req_id)
                _trace("reported", req_id)
        return (sending or None), (recving or None)

    def _stage(self, direction: str, blocks: List[int]) -> None:
        """Host-buffer mode: copies `blocks` device → host (``d2h``) or host → device
        (``h2d``) with vLLM's block-copy op; no-op otherwise. With ``host_buffer`` forced on
        CPU caches (there is no device: vLLM's CPU platform has no block-copy op) the copy is
        the same indexed copy, done here in torch: the mode's logic runs for real, its device
        copy is the only part a CPU host cannot exercise."""
        if self.device_caches is None or not blocks:
            return
        src, dst = ((self.device_caches, self.host_caches) if direction == "d2h"
                    else (self.host_caches, self.device_caches))
        on_cpu = all(t.device.type == "cpu" for t in self.device_caches.values())
        if not on_cpu:
            if self.copy_blocks is None:
                raise RuntimeError("hixl.vllm: KV caches on a device and no block-copy op "
                                   "(vLLM did not call set_host_xfer_buffer_ops)")
            self.copy_blocks(src, dst, blocks, blocks, direction)
            return
        import torch
        for name, s in src.items():
            d = dst[name]
            dim = self.block_dim[name]
            idx = torch.tensor(blocks, dtype=torch.long)
            d.index_copy_(dim, idx, s.index_select(dim, idx))

    def take_load_errors(self) -> Set[int]:
        e, self.load_errors = self.load_errors, set()
        return e

    def take_failed_reqs(self) -> Set[str]:
        """Requests whose pull failed, with several KV cache groups (reported per request)."""
        f, self.failed_reqs = self.failed_reqs, set()
        return f

    def shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.pool.shutdown(wait=True, cancel_futures=True)
        try:
            self.dd.finalize()
        except LLMException:
            pass
        # vLLM's shutdown path (SIGTERM included) reaches here; serve_e2e.py checks it did.
        logger.info("hixl: connector shut down, its engine closed")
