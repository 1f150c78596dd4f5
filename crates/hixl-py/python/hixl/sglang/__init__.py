"""hixl as a KV transfer backend of SGLang's prefill/decode disaggregation (SGLang 0.5.23),
as a plugin: install the ``hixl`` wheel into SGLang's environment (it is not on PyPI:
``tools/release.sh wheel`` in a checkout of the repository builds it, see docs/sglang.md), then::

    python -m sglang.launch_server ... --disaggregation-mode prefill \\
        --disaggregation-transfer-backend hixl
    python -m sglang.launch_server ... --disaggregation-mode decode \\
        --disaggregation-transfer-backend hixl

No SGLang file is changed: the wheel declares an entry point in SGLang's plugin group
``sglang.srt.plugins`` (``hixl = hixl.sglang:register``), which SGLang runs in every process
before it parses arguments or builds a scheduler. `register` adds ``hixl`` to the
``--disaggregation-transfer-backend`` choices and to SGLang's ``TransferBackend``, and hooks
``get_kv_class`` so that ``hixl`` yields `HixlKVManager`, `HixlKVSender`, `HixlKVReceiver`
and `HixlKVBootstrapServer` (``hixl.sglang._conn``). The prefill WRITEs into the decode's KV
pool, as SGLang's other backends do.

Settings (environment, read when a server starts):

=================================  ==========================================================
``HIXL_SGLANG_TRANSPORT``          ``auto`` (default: the fabric between processes of one
                                   host, verbs where both ends have RDMA, else tcp), ``tcp``,
                                   ``fabric``, ``verbs``
``HIXL_SGLANG_SECRET``             a shared secret: links are authenticated
``HIXL_SGLANG_TIMEOUT_S``          the bound of one write (default 30)
``HIXL_SGLANG_CONNECT_TIMEOUT_S``  first contact with a decode rank (default 5)
``HIXL_SGLANG_HOST`` ...           the network settings both connectors share, as
                                   ``HIXL_SGLANG_<NAME>``: ``HOST``, ``INTERFACE``, ``PORT``,
                                   ``VERBS_DEVICES``, ``VERBS_GID_INDEX``, ``DIRECTORY``,
                                   ``NAME`` (``hixl._netconf``); SGLang's
                                   ``--disaggregation-ib-device`` gives the RDMA devices
                                   unless ``HIXL_SGLANG_VERBS_DEVICES`` names others
=================================  ==========================================================

Host memory only for now (``--device cpu``); a server whose KV pool is on a device is
refused at start with a message saying so.
"""

from __future__ import annotations

from typing import Any, Dict

__all__ = ["register", "BACKEND"]

#: The name SGLang selects the backend by.
BACKEND = "hixl"


def _classes() -> Dict[str, Any]:
    from . import _conn

    return {
        "manager": _conn.HixlKVManager,
        "sender": _conn.HixlKVSender,
        "receiver": _conn.HixlKVReceiver,
        "bootstrap_server": _conn.HixlKVBootstrapServer,
    }


def _get_kv_class(original: Any, transfer_backend: Any, class_type: Any) -> Any:
    if getattr(transfer_backend, "value", transfer_backend) != BACKEND:
        return original(transfer_backend, class_type)
    kind = getattr(class_type, "value", class_type)
    if kind == "kvargs":
        return original(transfer_backend, class_type)
    return _classes()[kind]


def register() -> None:
    """SGLang's plugin entry point (group ``sglang.srt.plugins``)."""
    from enum import Enum

    from sglang.srt.arg_groups.choices import (  # type: ignore
        DISAGG_TRANSFER_BACKEND_CHOICES, add_disagg_transfer_backend_choices)
    from sglang.srt.disaggregation.utils import TransferBackend  # type: ignore
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # type: ignore

    if BACKEND not in DISAGG_TRANSFER_BACKEND_CHOICES:
        add_disagg_transfer_backend_choices([BACKEND])
    if BACKEND not in {m.value for m in TransferBackend}:
        # An Enum cannot grow: the same members plus HIXL, put in its place (SGLang's hook
        # registry also rebinds the modules that imported it).
        members = {m.name: m.value for m in TransferBackend}
        members["HIXL"] = BACKEND
        extended = Enum("TransferBackend", members)  # type: ignore[misc]
        extended.__module__ = TransferBackend.__module__
        HookRegistry.register("sglang.srt.disaggregation.utils.TransferBackend", extended,
                              HookType.REPLACE)
    HookRegistry.register("sglang.srt.disaggregation.utils.get_kv_class", _get_kv_class,
                          HookType.AROUND)
