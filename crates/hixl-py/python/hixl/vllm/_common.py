"""What both halves of the connector share: the logger, the transfer parameters' version,
the metadata vLLM carries between them, and the connector's ``kv_connector_extra_config``."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from concurrent.futures import Future
from typing import Any, Dict, List, NamedTuple, Optional, Set, Tuple

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
    KVConnectorHandshakeMetadata, KVConnectorMetadata)
from vllm.logger import init_logger  # type: ignore

from .. import _netconf


# Under "vllm." so that vLLM's logging configuration (handlers, level, format) covers it.
logger = init_logger("vllm.distributed.kv_transfer.hixl")

#: Bumped when the transfer parameters change shape: a decode refuses another version.
PARAMS_VERSION = 4


_TRACE = os.environ.get("HIXL_VLLM_TRACE")


def _trace(what: str, req_id: str) -> None:
    if _TRACE:
        with open(_TRACE, "a") as f:
            f.write(f"{time.time():.6f} {os.getpid()} {what} {req_id}\n")


def _u64_of(req_id: str) -> int:
    """The request id datadist's leases carry: 64 bits of a hash of vLLM's id (the lease's
    own id and generation, not this, keep requests apart)."""
    return int.from_bytes(hashlib.blake2b(req_id.encode(), digest_size=8).digest(), "little")


@dataclasses.dataclass
class HixlHandshakeMetadata(KVConnectorHandshakeMetadata):  # type: ignore[misc]
    """What a worker tells its scheduler at start-up (vLLM carries it): where the worker's
    hixl instance listens and which of its caches holds the KV."""

    host: str
    port: int
    cluster_id: int
    cache_id: int
    num_blocks: int
    block_bytes: int
    tensors: int
    tp_rank: int
    tp_size: int = 1
    #: the worker's compatibility record (``_geometry.COMPARED``)
    compat: Dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the name the worker publishes in the directory ("" without one): a decode with the
    #: directory too links by it, not by ``host:port``
    name: str = ""
    #: the worker's PP stage and the stages of its engine
    pp_rank: int = 0
    pp_size: int = 1
    #: per KV cache group, its first registered layer and the model's index of each layer
    #: (``_stages``)
    layers: List[Any] = dataclasses.field(default_factory=list)


class HixlConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One engine step's orders from the scheduler half to the worker half."""

    def __init__(self) -> None:
        #: prefill: leases to create, ``req_id -> [grant dict per worker]`` (PP stage-major,
        #: then TP rank)
        self.to_lease: Dict[str, List[Dict[str, Any]]] = {}
        #: decode: pulls to start, ``req_id -> (local block ids per KV cache group, transfer
        #: params)``
        self.to_recv: Dict[str, Tuple[List[List[int]], Dict[str, Any]]] = {}
        #: decode: leases it will not pull (aborted before the pull, or a full local hit)
        self.to_drop: Dict[str, Dict[str, Any]] = {}


class _Pull(NamedTuple):
    """A decode's pull in flight: its result (the local blocks that did not land, and why),
    when it was started, and the local blocks it fills."""

    future: "Future[Tuple[Set[int], Optional[str]]]"
    started: float
    local: List[int]  # every group's


#: The connector's own settings (its network settings are ``hixl._netconf.NAMES``).
OWN = ("lease_ms", "lease_wait_ms", "link_timeout_ms", "wait_ms", "host_buffer")


def _extra(vllm_config: Any) -> Dict[str, Any]:
    kt = vllm_config.kv_transfer_config
    extra = dict(getattr(kt, "kv_connector_extra_config", None) or {})
    known = set(OWN) | set(_netconf.NAMES)
    unknown = sorted(set(extra) - known)
    if unknown:
        raise ValueError(f"hixl.vllm: unknown kv_connector_extra_config key(s) {unknown}; "
                         f"known: {sorted(known)}")
    for k, d in (("lease_ms", 30000), ("lease_wait_ms", 2000), ("link_timeout_ms", 5000),
                 ("wait_ms", 5)):
        v = extra.get(k, d)
        lo = 0 if k == "wait_ms" else 1
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"hixl.vllm: {k} = {v!r}: expected an int >= {lo} (ms)")
        extra[k] = v
    hb = extra.get("host_buffer")
    if hb is not None and not isinstance(hb, bool):
        raise ValueError(f"hixl.vllm: host_buffer = {hb!r}: expected true or false")
    net = _netconf.validate("hixl.vllm", extra)
    extra.update(net)
    # The address the workers advertise: the settings', else vLLM's own (VLLM_HOST_IP),
    # else the one that routes off this host (_netconf.pick_host).
    extra["host"] = _netconf.pick_host(net, os.environ.get("VLLM_HOST_IP") or None)
    return extra
