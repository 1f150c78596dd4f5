"""The connector's scheduler half (EngineCore process): which requests load remotely, and the
transfer parameters (with a minted lease grant) a finished prefill hands the decode."""

from __future__ import annotations

import secrets
from typing import Any, Dict, List, Optional, Tuple

from ._common import (PARAMS_VERSION, HixlConnectorMetadata, HixlHandshakeMetadata, _trace,
                      _u64_of, logger)
from ._geometry import new_blocks


class _Scheduler:
    def __init__(self, vllm_config: Any, extra: Dict[str, Any]) -> None:
        self.engine_id = str(vllm_config.kv_transfer_config.engine_id)
        self.tp_size = int(vllm_config.parallel_config.tensor_parallel_size)
        self.pp_size = int(getattr(vllm_config.parallel_config, "pipeline_parallel_size", 1)
                           or 1)
        self.block_size = int(vllm_config.cache_config.block_size)
        self.lease_ms = int(extra["lease_ms"])
        #: the workers' metadata by (PP stage, TP rank)
        self.ranks: Dict[Tuple[int, int], HixlHandshakeMetadata] = {}
        # Lease ids: unique for this scheduler's worker, whose lease table lives as long as
        # this process; generations are random, so a grant from an earlier incarnation of
        # the same ids never matches.
        self.next_lease = 0
        self.to_lease: Dict[str, List[Dict[str, Any]]] = {}
        self.to_recv: Dict[str, Tuple[List[List[int]], Dict[str, Any]]] = {}
        self.to_drop: Dict[str, Dict[str, Any]] = {}

    def set_handshake(self, metadata: Dict[Any, Any]) -> None:
        """The workers' metadata, by TP rank or by (PP stage, TP rank)."""
        for rank, md in metadata.items():
            if isinstance(md, HixlHandshakeMetadata):
                pp, tp = rank if isinstance(rank, tuple) else (0, rank)
                self.ranks[(int(pp), int(tp))] = md

    @staticmethod
    def _pull_params(params: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        if not params or not params.get("do_remote_prefill"):
            return None
        h = params.get("hixl")
        if not isinstance(h, dict) or h.get("v") != PARAMS_VERSION:
            return None
        return h

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int) -> Tuple[int, bool]:
        h = self._pull_params(request.kv_transfer_params)
        if h is None:
            if request.kv_transfer_params and request.kv_transfer_params.get("do_remote_prefill"):
                logger.warning("hixl: request %s has do_remote_prefill but no hixl transfer "
                               "parameters of version %d: computing its prompt here",
                               request.request_id, PARAMS_VERSION)
            return 0, False
        n = len(request.prompt_token_ids or ()) - num_computed_tokens
        _trace("matched", request.request_id)
        return (n, True) if n > 0 else (0, False)

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        params = request.kv_transfer_params
        h = self._pull_params(params)
        if h is None:
            return
        if num_external_tokens > 0:
            local, pos = new_blocks(blocks.blocks)
            self.to_recv[request.request_id] = (local, {"hixl": h, "pos": pos})
        else:
            # Everything is here already (a local prefix hit): free the prefill's blocks.
            self.to_drop[request.request_id] = {"hixl": h}
        # One pull per request: this is called again after the load.
        params["do_remote_prefill"] = False

    def request_finished(self, request: Any,
                         block_ids: Any) -> Tuple[bool, Optional[Dict[str, Any]]]:
        params = request.kv_transfer_params
        if not params:
            return False, None
        h = self._pull_params(params)
        if h is not None:
            # A decode request that ends before its pull was scheduled: the prefill's blocks
            # must not wait for the lease to expire.
            self.to_drop[request.request_id] = {"hixl": h}
            params["do_remote_prefill"] = False
            return False, None
        if not params.get("do_remote_decode"):
            return False, None
        from vllm.v1.request import RequestStatus  # type: ignore
        if request.status not in (RequestStatus.FINISHED_LENGTH_CAPPED,
                                  RequestStatus.FINISHED_STOPPED):
            return False, None
        groups = ([[int(b) for b in g] for g in block_ids]
                  if block_ids and isinstance(block_ids[0], (list, tuple))
                  else [[int(b) for b in block_ids]])
        # Block 0 is vLLM's null block (a sliding window's dropped positions): never leased.
        blocks = sorted({b for g in groups for b in g if b != 0})
        if not blocks:
            return False, None
        workers = [(pp, tp) for pp in range(self.pp_size) for tp in range(self.tp_size)]
        if any(w not in self.ranks for w in workers):
            logger.error("hixl: request %s: the handshake metadata of %d of %d workers is "
                         "missing: the decode computes its prompt", request.request_id,
                         sum(w not in self.ranks for w in workers), len(workers))
            return False, None
        self.next_lease += 1
        gen = secrets.randbits(63) | 1
        rid = _u64_of(request.request_id)
        grants = []
        ranks = []
        for w in workers:
            md = self.ranks[w]
            grants.append({"owner": md.cluster_id, "lease_id": self.next_lease,
                           "generation": gen, "request_id": rid, "caches": [md.cache_id],
                           "blocks": blocks, "ttl_ms": self.lease_ms})
            ranks.append({"host": md.host, "port": md.port, "cluster_id": md.cluster_id,
                          "block_bytes": md.block_bytes, "tensors": md.tensors,
                          "name": getattr(md, "name", ""), "pp_rank": w[0], "tp_rank": w[1],
                          "layers": getattr(md, "layers", [])})
        self.to_lease[request.request_id] = grants
        return True, {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": groups,
            "remote_engine_id": self.engine_id,
            "remote_request_id": request.request_id,
            "remote_num_tokens": int(request.num_computed_tokens),
            "tp_size": self.tp_size,
            "hixl": {"v": PARAMS_VERSION, "grants": grants, "ranks": ranks,
                     "block_size": self.block_size, "tp_size": self.tp_size,
                     "pp_size": self.pp_size,
                     "engine_id": self.engine_id, "remote_block_ids": groups,
                     "tokens": int(request.num_computed_tokens),
                     "compat": self.ranks[(0, 0)].compat},
        }

    def build_connector_meta(self) -> HixlConnectorMetadata:
        meta = HixlConnectorMetadata()
        meta.to_lease, self.to_lease = self.to_lease, {}
        meta.to_recv, self.to_recv = self.to_recv, {}
        meta.to_drop, self.to_drop = self.to_drop, {}
        return meta


# ==================================================================== worker half
