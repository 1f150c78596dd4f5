"""One SGLang scheduler rank of the harness: its config published as SGLang's launcher does,
its KV pool, its KV manager, and the sender or receiver calls SGLang's prefill or decode
scheduler makes (disaggregation/prefill.py, decode.py), in the same order:

prefill (``PrefillBootstrapQueue`` then the inflight queue):
  ``sender = Sender(mgr, bootstrap_addr, bootstrap_room)``;  ``poll()`` until
  ``WaitingForInput`` (the decode has sent its page indices); ``init(num_pages, aux_index)``;
  ``send(page_indices)`` once per chunk (the last chunk also carries aux); ``poll()`` until
  ``Success`` (free the pages, ``get_transfer_metric()``, ``clear()``) or ``Failed``
  (``failure_exception()`` raises ``KVTransferError`` naming the cause; free the pages).
decode (``DecodePreallocQueue`` then ``DecodeTransferQueue``):
  ``receiver = Receiver(mgr, bootstrap_addr, bootstrap_room)``; ``init(prefill_dp_rank)``;
  ``poll()`` until ``WaitingForInput``; allocate pages; ``send_metadata(page_indices,
  aux_index, state_indices)``; ``poll()`` until ``Success`` (the KV and aux are there) or
  ``Failed`` (``failure_exception()``); ``abort()`` when the request is aborted; ``clear()``.

Every line it prints is one JSON object (``event``: ready, req, summary).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any, Dict, List

import numpy as np
import torch

import _kv


def out(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


def publish(args: Any, mode: str, tp: int, rank: int) -> Any:
    """The config a scheduler process of this role publishes (``publish(role=scheduler)``)."""
    from sglang.srt.runtime_context import SpawnRanks, publish as _publish
    from sglang.srt.server_args import ServerArgs

    # the prefill server's address is the bootstrap server's (its ranks register there)
    host = args.bootstrap_host if mode == "prefill" else "127.0.0.1"
    sa = ServerArgs(model_path=args.model_dir, device="cpu", tp_size=tp, host=host,
                    disaggregation_mode=mode, disaggregation_transfer_backend=args.backend,
                    disaggregation_bootstrap_port=args.bootstrap_port,
                    page_size=args.page, skip_tokenizer_init=True)
    ctx = _publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=rank, gpu_id=0))
    # No torch.distributed here: each rank's polls are read one by one by the driver rather
    # than all-reduced over the TP group, and a one-stage pipeline's group is never used.
    ctx.parallel.override_permanently(pp_group=None)
    return sa


def manager(args: Any, mode: str, tp: int, rank: int) -> Dict[str, Any]:
    from sglang.srt.plugins import load_plugins

    load_plugins()  # what every SGLang process does first: hixl registers here
    from sglang.srt.disaggregation.utils import (DisaggregationMode, KVClassType,
                                                 MetadataBuffers, TransferBackend, get_kv_class)
    from sglang.srt.runtime_context import get_disagg

    sa = publish(args, mode, tp, rank)
    backend = TransferBackend(get_disagg().disaggregation_transfer_backend)
    if backend.value == "mooncake":
        from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import \
            init_mooncake_transfer_engine
        init_mooncake_transfer_engine(hostname="127.0.0.1", gpu_id=0, ib_device=None)
    g = _kv.geometry(args.model, tp, rank, args.page)
    pool = _kv.make_pool(g, args.pool_tokens)
    meta = MetadataBuffers(args.slots, hidden_size=16, hidden_states_dtype=torch.float32,
                           max_sampling_mask_tokens=1)
    kv_args = _kv.kv_args(get_kv_class(backend, KVClassType.KVARGS), pool, g, meta)
    dmode = DisaggregationMode.PREFILL if mode == "prefill" else DisaggregationMode.DECODE
    mgr = get_kv_class(backend, KVClassType.MANAGER)(kv_args, dmode, sa, g.mla)
    eng = getattr(mgr, "engine", None)
    if hasattr(eng, "get_session_id"):  # the address this rank's engine advertises
        out(event="engine", role=mode, rank=rank, session=eng.get_session_id(),
            local_ip=getattr(mgr, "local_ip", None))
    return {"backend": backend, "g": g, "pool": pool, "bufs": _kv.buffers(pool, g),
            "meta": meta, "mgr": mgr, "classes": {
                k: get_kv_class(backend, t) for k, t in
                (("sender", KVClassType.SENDER), ("receiver", KVClassType.RECEIVER))}}


class Pages:
    """A free list of pool pages (page 0 is SGLang's padding page), handed out shuffled so a
    request's pages are scattered as in a running server."""

    def __init__(self, count: int, seed: int) -> None:
        self.free = list(range(1, count))
        random.Random(seed).shuffle(self.free)
        self.total = len(self.free)

    def take(self, n: int) -> List[int]:
        if n > len(self.free):
            raise RuntimeError(f"{n} pages wanted, {len(self.free)} free")
        got, self.free = self.free[:n], self.free[n:]
        return got

    def give(self, pages: List[int]) -> None:
        self.free.extend(pages)


def stages(role: str, rank: int, active: Dict[int, Dict[str, Any]], obj: str) -> None:
    """Where the requests in flight are (stage/poll: count, and a few rooms), every 5 s: the
    driver shows the last one of a rank that hung."""
    count: Dict[str, int] = {}
    rooms: Dict[str, List[int]] = {}
    for room, r in active.items():
        key = f"{r['stage']}/{r[obj].poll()}"
        count[key] = count.get(key, 0) + 1
        rooms.setdefault(key, []).append(room)
    out(event="stages", role=role, rank=rank, stages=count,
        rooms={k: v[:3] for k, v in rooms.items()})


def links(mgr: Any) -> Dict[str, str]:
    """The peers this rank's hixl engine is linked to, and the transport of each."""
    eng = getattr(getattr(mgr, "engine", None), "engine", None)
    got: Dict[str, str] = {}
    try:
        for p in eng.peers() if eng is not None else []:
            got[p] = eng.peer(p).transport
    except Exception as e:  # a link dropped meanwhile: reported next time
        got["?"] = f"unreadable: {e}"
    return got


def report_links(mgr: Any, rank: int, seen: Dict[str, str]) -> Dict[str, str]:
    """Prints this prefill rank's links (where to, over what) when they changed."""
    now = links(mgr)
    if now and now != seen:
        out(event="links", role="prefill", rank=rank, links=now, t=time.monotonic())
        return now
    return seen


def _pages_of(tokens: int, page: int) -> int:
    return -(-tokens // page)


def _swa_pages_of(g: "_kv.Geometry", tokens: int) -> int:
    """Pages of a request's SWA window (none without SWA layers)."""
    return _pages_of(tokens - g.window_start(tokens), g.page) if g.swa_layers else 0


def run_prefill(args: Any, rank: int, reqs: List[Dict[str, Any]]) -> None:
    from sglang.srt.disaggregation.base.conn import KVPoll

    m = manager(args, "prefill", args.prefill_tp, rank)
    g, mgr, Sender = m["g"], m["mgr"], m["classes"]["sender"]
    pages = Pages(args.pool_tokens // g.page, seed=rank)
    swa = Pages(args.pool_tokens // g.page, seed=50 + rank)  # the SWA sub-pool's pages
    slots = list(range(args.slots))
    out(event="ready", role="prefill", rank=rank, pid=os.getpid())
    todo = list(reqs)
    active: Dict[int, Dict[str, Any]] = {}
    addr = f"{args.bootstrap_host}:{args.bootstrap_port}"
    t_start = time.perf_counter()
    next_report = t_start + 5
    seen_links: Dict[str, str] = {}
    next_links = t_start if m["backend"].value == "hixl" else float("inf")
    while todo or active:
        while todo and len(active) < args.window:
            r = todo.pop(0)
            r["sender"] = Sender(mgr=mgr, bootstrap_addr=addr, bootstrap_room=r["room"],
                                 req_has_disagg_prefill_dp_rank=False)
            r["stage"], r["t0"] = "bootstrap", time.perf_counter()
            active[r["room"]] = r
        for room, r in list(active.items()):
            st = r["sender"].poll()
            if r["stage"] == "bootstrap" and st == KVPoll.WaitingForInput:
                n = _pages_of(r["tokens"], g.page)
                n_swa = _swa_pages_of(g, r["tokens"])
                if n > len(pages.free) or n_swa > len(swa.free) or not slots:
                    continue  # waits until memory is free
                r["pages"], r["slot"] = pages.take(n), slots.pop()
                r["swa"] = swa.take(n_swa)
                if args.verify:
                    _kv.fill(m["bufs"], g, room, r["pages"], r["tokens"], r["swa"])
                m["meta"].output_ids[r["slot"], 0] = room & 0x7FFFFFFF
                r["sender"].init(n, r["slot"])
                r["t_send"] = time.perf_counter()
                idx = np.asarray(r["pages"], dtype=np.int32)
                cut = n // 2 if args.chunks > 1 and n > 1 else n
                # the SWA window's pages go with the last chunk, as prefill.py sends state
                state = [np.asarray(r["swa"], dtype=np.int32)] if g.swa_layers else None
                parts = [p for p in (idx[:cut], idx[cut:]) if len(p)]
                for i, part in enumerate(parts):  # a chunked prefill's sends
                    r["sender"].send(part, state if i == len(parts) - 1 else None)
                r["stage"] = "inflight"
                if not seen_links and next_links < float("inf"):  # the first link, soon
                    seen_links = report_links(mgr, rank, seen_links)
            elif st in (KVPoll.Success, KVPoll.Failed):
                ok, why = st == KVPoll.Success, None
                if not ok:
                    try:
                        r["sender"].failure_exception()
                    except Exception as e:  # KVTransferError: the cause, as SGLang gets it
                        why = str(e)
                metric = r["sender"].get_transfer_metric() if ok else None
                if ok:
                    r["sender"].clear()
                pages.give(r.get("pages", []))
                swa.give(r.get("swa", []))
                if "slot" in r:
                    slots.append(r["slot"])
                t_send = r.get("t_send", time.perf_counter())
                out(event="req", role="prefill", rank=rank, room=room, ok=ok, why=why,
                    ms=(time.perf_counter() - t_send) * 1e3,
                    bytes=getattr(metric, "transfer_total_bytes", None),
                    latency_ms=(getattr(metric, "transfer_latency_s", None) or 0) * 1e3)
                del active[room]
        if time.perf_counter() >= next_links:
            next_links = time.perf_counter() + 1.0
            seen_links = report_links(mgr, rank, seen_links)
        if time.perf_counter() >= next_report:
            next_report = time.perf_counter() + 5
            stages("prefill", rank, active, "sender")
        time.sleep(args.tick)
    out(event="summary", role="prefill", rank=rank, wall_s=time.perf_counter() - t_start,
        free_pages=len(pages.free) + len(swa.free), total_pages=pages.total + swa.total,
        free_slots=len(slots))


def run_decode(args: Any, rank: int, reqs: List[Dict[str, Any]]) -> None:
    from sglang.srt.disaggregation.base.conn import KVPoll

    m = manager(args, "decode", args.decode_tp, rank)
    g, mgr, Receiver = m["g"], m["mgr"], m["classes"]["receiver"]
    pages = Pages(args.pool_tokens // g.page, seed=100 + rank)
    swa = Pages(args.pool_tokens // g.page, seed=150 + rank)
    slots = list(range(args.slots))
    out(event="ready", role="decode", rank=rank, pid=os.getpid())
    todo = list(reqs)
    active: Dict[int, Dict[str, Any]] = {}
    addr = f"{args.bootstrap_host}:{args.bootstrap_port}"
    abort = set(args.abort_rooms)
    quarantine: List[Any] = []
    next_info, tries, next_report = 0.0, 0, time.perf_counter() + 5
    seen_info = False
    from sglang.srt.environ import envs

    # decode.py's bound on holding a failed request's pages for the prefill's acks
    release_timeout = envs.SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT.get()
    t_start = time.perf_counter()
    while todo or active:
        while todo and len(active) < args.window:
            r = todo.pop(0)
            r["recv"] = Receiver(mgr=mgr, bootstrap_addr=addr, bootstrap_room=r["room"])
            r["stage"], r["t0"] = "pending", time.perf_counter()
            active[r["room"]] = r
        # DecodePreallocQueue: a receiver is initialised once the prefill's parallel info
        # is known (its ranks registered at the bootstrap server); a one-DP prefill is rank 0
        # (retried once a second; after 15 tries its requests are aborted, as decode.py does)
        pending = [r for r in active.values() if r["stage"] == "pending"]
        if pending and time.perf_counter() >= next_info:
            if mgr.try_ensure_parallel_info(addr):
                tries = 0
                for r in pending:
                    r["recv"].init(0)
                    r["stage"] = "bootstrap"
            else:
                tries += 1
                next_info = time.perf_counter() + 1.0
                if tries >= 15:
                    tries = 0
                    for r in pending:
                        r["recv"].abort()
                        r["stage"] = "bootstrap"
        for room, r in list(active.items()):
            if r["stage"] == "pending":
                continue
            if r["stage"] == "held":
                waited = time.perf_counter() - r["held_at"]
                if mgr.is_abort_release_safe(room, r["need"]) or waited > release_timeout:
                    mgr.clear_deferred_abort_state(room)
                    r["recv"].clear()
                    # released: from now on no byte of this request may land here
                    quarantine.append((room, r["pages"], r["swa"], r["tokens"]))
                    _kv.mark(m["bufs"], g, r["pages"], r["swa"], r["tokens"], -2)
                    slots.append(r["slot"])
                    out(event="req", role="decode", rank=rank, room=room, ok=False,
                        why=r["why"], bad=[], ms=waited * 1e3, aborted=room in abort,
                        since_start_ms=(time.perf_counter() - r["t0"]) * 1e3,
                        t_end=time.monotonic(),
                        t_failed=r["t_failed"],
                        released_by="acks" if waited <= release_timeout else "timeout")
                    del active[room]
                continue
            st = r["recv"].poll()
            if r["stage"] == "bootstrap" and st == KVPoll.WaitingForInput:
                need, n_swa = _pages_of(r["tokens"], g.page), _swa_pages_of(g, r["tokens"])
                if need > len(pages.free) or n_swa > len(swa.free) or not slots:
                    continue  # DecodePreallocQueue: waits until memory is free
                r["pages"], r["swa"] = pages.take(need), swa.take(n_swa)
                r["slot"] = slots.pop()
                # what was there before: not the pattern
                _kv.mark(m["bufs"], g, r["pages"], r["swa"], r["tokens"], -1)
                m["meta"].output_ids[r["slot"], 0] = -1
                r["t_meta"] = time.perf_counter()
                state = [np.asarray(r["swa"], dtype=np.int32)] if g.swa_layers else None
                r["recv"].send_metadata(np.asarray(r["pages"], dtype=np.int32), r["slot"],
                                        state)
                r["stage"] = "transfer"
                if not seen_info:  # the prefill's side channel, as the bootstrap gave it
                    seen_info = True
                    out(event="bootstrap_info", role="decode", rank=rank, rank_ips=sorted(
                        {str(i.get("rank_ip")) for i in r["recv"].bootstrap_infos or []}))
                if room in abort:  # the request is aborted while its KV is on the way
                    r["recv"].abort()
                    r["aborted_at"] = time.perf_counter()
            elif st in (KVPoll.Success, KVPoll.Failed):
                ok, why, bad = st == KVPoll.Success, None, []
                if ok and args.verify:
                    bad = _kv.check(m["bufs"], g, room, r["pages"], r["tokens"], r["swa"])
                    if int(m["meta"].output_ids[r["slot"], 0]) != room & 0x7FFFFFFF:
                        bad.append(f"room {room}: aux slot {r['slot']} did not land")
                if not ok:
                    try:
                        r["recv"].failure_exception()
                    except Exception as e:
                        why = str(e)
                    if "pages" in r and mgr.enable_deferred_decode_kv_release:
                        # decode.py's deferred release: the pages stay out of use until
                        # every prefill rank that could still write them has acked
                        if not r["recv"].abort_notified:
                            r["recv"].ensure_abort_notified(force_arm=True)
                        need = len(r["recv"].bootstrap_infos) if r["recv"].abort_notified else 0
                        r.update(stage="held", why=why, need=need, held_at=time.perf_counter(),
                                 t_failed=time.monotonic())
                        continue
                r["recv"].clear()
                pages.give(r.get("pages", []))
                swa.give(r.get("swa", []))
                if "slot" in r:
                    slots.append(r["slot"])
                t = r.get("t_meta", r["t0"])
                out(event="req", role="decode", rank=rank, room=room, ok=ok and not bad,
                    why=why, bad=bad[:4], ms=(time.perf_counter() - t) * 1e3,
                    since_start_ms=(time.perf_counter() - r["t0"]) * 1e3,
                    t_end=time.monotonic(), t_failed=time.monotonic(), aborted=room in abort)
                del active[room]
        if time.perf_counter() >= next_report:
            next_report = time.perf_counter() + 5
            stages("decode", rank, active, "recv")
        time.sleep(args.tick)
    wall = time.perf_counter() - t_start
    late = []  # a write that landed in a released request's pages
    for room, pgs, swa_pgs, tokens in quarantine:
        late += [f"room {room} {b}" for b in _kv.unmarked(m["bufs"], g, pgs, swa_pgs, tokens, -2)]
        pages.give(pgs)
        swa.give(swa_pgs)
    out(event="summary", role="decode", rank=rank, wall_s=wall,
        free_pages=len(pages.free) + len(swa.free), total_pages=pages.total + swa.total,
        released=len(quarantine), late_writes=late[:8])


def run_bootstrap(args: Any) -> None:
    """The prefill server's main process: it runs the KV bootstrap server (SGLang's
    ``start_disagg_service``), which the decode's heartbeats reach."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.managers.disagg_service import start_disagg_service
    from sglang.srt.runtime_context import publish as _publish
    from sglang.srt.server_args import ServerArgs

    sa = ServerArgs(model_path=args.model_dir, device="cpu", tp_size=args.prefill_tp,
                    host=args.bootstrap_host, disaggregation_mode="prefill",
                    disaggregation_transfer_backend=args.backend,
                    disaggregation_bootstrap_port=args.bootstrap_port, page_size=args.page,
                    skip_tokenizer_init=True)
    _publish(sa, role="tokenizer")
    start_disagg_service()
    out(event="ready", role="bootstrap", rank=0, pid=os.getpid())
    while True:  # until the driver ends it
        time.sleep(1)


def main(args: Any) -> None:
    import logging

    logging.basicConfig(level=os.environ.get("PD_HARNESS_LOG", "WARNING").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    reqs = [dict(r) for r in json.loads(args.reqs)]
    try:
        if args.role == "bootstrap":
            run_bootstrap(args)
        elif args.role == "prefill":
            run_prefill(args, args.rank, reqs)
        else:
            run_decode(args, args.rank, reqs)
    except Exception as e:
        out(event="error", role=args.role, rank=args.rank, error=f"{type(e).__name__}: {e}")
        raise
    sys.stdout.flush()
    os._exit(0)  # SGLang's manager threads are daemons that never end on their own
