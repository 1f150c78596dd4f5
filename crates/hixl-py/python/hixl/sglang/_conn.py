"""hixl's classes for SGLang's PD disaggregation (SGLang 0.5.23).

SGLang's transfer tier (``disaggregation/common``: bootstrap server, ZMQ side channel,
heartbeats, timeouts, failure records, deferred KV release) and its prefill transfer worker
(the one its Mooncake backend runs: contiguous page runs, head slices when attention-TP
differs, MLA, aux and state buffers, a final status per decode rank) move the bytes through
an engine of five calls. Here that engine is hixl's (`HixlTransferEngine`): each call is one
hixl WRITE of every piece, zero-copy from the prefill's KV pool into the decode's.
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional

from sglang.srt.disaggregation.base.conn import KVPoll  # type: ignore
from sglang.srt.disaggregation.mooncake.conn import (  # type: ignore
    MooncakeKVBootstrapServer, MooncakeKVManager, MooncakeKVReceiver, MooncakeKVSender)

from ._engine import HixlTransferEngine, settings

__all__ = ["HixlKVManager", "HixlKVSender", "HixlKVReceiver", "HixlKVBootstrapServer",
           "check_host_memory"]

logger = logging.getLogger("hixl.sglang")


def check_host_memory(server_args: Any) -> None:
    """Refuses KV pools outside host memory: hixl registers host memory only (for now)."""
    device = str(getattr(server_args, "device", None) or "cpu")
    if device != "cpu":
        raise ValueError(
            f"hixl's SGLang backend moves KV caches in host memory only; this server's "
            f"--device is {device!r}, so its KV pool is device memory, which hixl cannot "
            f"register yet. Run with --device cpu, or pick another "
            f"--disaggregation-transfer-backend.")


def _ib_device(server_args: Any, gpu_id: int) -> Optional[str]:
    """This rank's ``--disaggregation-ib-device`` (SGLang's per-GPU mapping applied), or
    None."""
    raw = getattr(server_args, "disaggregation_ib_device", None)
    if not raw:
        return None
    try:
        from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import (  # type: ignore  # noqa: E501
            get_ib_devices_for_gpu)
        return get_ib_devices_for_gpu(raw, int(gpu_id or 0)) or None
    except ImportError:
        return str(raw)


class HixlKVManager(MooncakeKVManager):  # type: ignore[misc]
    """SGLang's KV manager with hixl as its engine."""

    sender_trace_module = "hixl"

    def init_engine(self) -> None:
        check_host_memory(self.server_args)
        args = self.server_args
        net = settings(ib_device=_ib_device(args, getattr(self.kv_args, "gpu_id", 0)))
        role = str(getattr(self.disaggregation_mode, "value", self.disaggregation_mode))[:1]
        self.engine = HixlTransferEngine(self.local_ip, net=net,
                                         rank=int(getattr(self.kv_args, "engine_rank", 0)),
                                         role=role or "x")
        logger.info("hixl: %s engine %s (%s)", self.disaggregation_mode,
                    self.engine.get_session_id(), self.engine.engine.info().get("transport"))

    def _session_causes(self, room: int) -> List[str]:
        infos = getattr(self, "transfer_infos", {}).get(room) or {}
        causes = []
        for info in infos.values():
            why = self.engine.last_error(getattr(info, "mooncake_session_id", ""))
            if why and why not in causes:
                causes.append(why)
        return causes

    def conclude_transfer(self, *, bootstrap_room: int, status: Any,
                          targets: Optional[List[Any]] = None,
                          failure_reason: Optional[str] = None) -> Any:
        # The tier says which chunk failed; hixl says why (peer lost, timeout, refused).
        if status == KVPoll.Failed and failure_reason:
            causes = self._session_causes(bootstrap_room)
            if causes:
                failure_reason = f"{failure_reason} ({'; '.join(causes)})"
        return super().conclude_transfer(bootstrap_room=bootstrap_room, status=status,
                                          targets=targets, failure_reason=failure_reason)

    def teardown(self) -> None:
        super().teardown()
        self.engine.close()


class HixlKVSender(MooncakeKVSender):  # type: ignore[misc]
    pass


class HixlKVReceiver(MooncakeKVReceiver):  # type: ignore[misc]
    pass


class HixlKVBootstrapServer(MooncakeKVBootstrapServer):  # type: ignore[misc]
    pass
