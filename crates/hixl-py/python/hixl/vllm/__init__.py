"""hixl as a vLLM KV connector (vLLM 0.32, V1 connector API), for prefill/decode disaggregation.

Load it with::

    --kv-transfer-config '{"kv_connector": "HixlConnector",
                           "kv_connector_module_path": "hixl.vllm",
                           "kv_role": "kv_producer"}'          # kv_consumer on the decode side

The decode side pulls (as vLLM's NixlConnector does). What happens to one request:

* prefill, EngineCore (``SCHEDULER`` half): when the prompt is done, ``request_finished`` keeps
  the request's blocks and returns transfer parameters naming the prefill worker's hixl address
  and a **lease grant** for the blocks, minted here (id + random generation);
* prefill, Worker (``WORKER`` half): on its next step it creates that lease in its
  ``hixl.llm_datadist`` instance. From then on the blocks are the decode's to pull, and no
  other request can be served from them;
* decode, Worker: pulls the leased blocks into the request's local blocks, one ``READ`` per
  contiguous run, checked against the lease before a byte moves, and reports the lease done;
* prefill, Worker: the lease ends (done, or expired after ``lease_ms`` without progress, or
  the decode's link died) and only then the request appears in ``finished_sending``, so vLLM
  frees its blocks: never earlier, never leaked.

A pull that fails, wholly or in part, reports exactly the local blocks that did not land
through ``get_block_ids_with_load_errors``; vLLM's ``kv_load_failure_policy`` (``fail`` /
``recompute``) decides what happens to the request. A pull presented before the prefill
worker created the lease (it runs one step later) is refused with nothing moved and retried
for up to ``lease_wait_ms``.

``kv_connector_extra_config`` keys (all optional):

==================  ====================================================================
``transport``       ``auto`` (default: the shared-memory fabric between processes of one
                    host, else verbs when both workers have an active RDMA device, else
                    tcp), ``tcp``, ``fabric`` or ``verbs``: hixl's ``hixl.Transport`` (a
                    forced transport that cannot serve a peer fails, never falls back)
``host``            the address the worker listens on and advertises (default
                    ``VLLM_HOST_IP``, else the address that routes off this host)
``interface``,      the other network settings both connectors share (``hixl._netconf``,
``port``, ...       docs/cross-host.md): ``interface``, ``port`` (rank r listens on
                    port + r), ``verbs_devices``, ``verbs_gid_index``, ``directory``
                    (link by name through etcd), ``name``
``lease_ms``        how long a prefill keeps a request's blocks for a decode that makes no
                    progress (default 30000)
``lease_wait_ms``   how long a decode retries a pull the prefill has not leased yet
                    (default 2000)
``secret``          a shared secret: links are authenticated (``hixl.AuthSecret``)
``link_timeout_ms`` first contact with a prefill worker (default 5000)
``wait_ms``         a decode step waits up to this long for pulls it started less than
                    this long ago, so a pull is reported in the step that started it
                    (default 5; 0: never wait, poll only)
``host_buffer``     stage the KV through host buffers (default: when the KV caches are
                    not in host memory; ``true`` forces it, e.g. to test the mode on CPU)
==================  ====================================================================

Telemetry: every pull is recorded (post and transfer time, bytes, descriptors, the link's
transport) in :class:`HixlKVConnectorStats` (``get_kv_connector_stats``, NIXL's keys), and
vLLM's Prometheus endpoint shows it through :class:`HixlPromMetrics` (``vllm:hixl_*``).

KV caches on an accelerator: hixl moves host memory, so the connector uses vLLM's host-buffer
mode, as NixlConnector does with ``kv_buffer_device="cpu"``: it registers a host copy of the
caches' layout, copies a request's blocks device → host before it leases them (prefill) and
host → device after they landed, before vLLM is told (decode), with the block-copy op vLLM
hands it (``set_host_xfer_buffer_ops``). Said plainly: that device copy is untested here (no
GPU on this machine kind); the mode itself is tested end to end on CPU caches with
``host_buffer: true``, where vLLM's CPU platform has no block-copy op and the connector does
the same indexed copy in torch.

Tensor parallelism: prefill and decode may differ; each decode rank pulls exactly its KV heads
from the prefill ranks holding them (``pull_leased_blocks_resharded``, under each rank's
lease). MLA caches are read once. The connector declares vLLM's ``SupportsHMA``: a hybrid
model's KV cache groups (full attention, sliding window) are pulled group by group, each decode
block from the prefill's block at the same position of the request, and a failed pull is
reported per request (``failed_recving``), as vLLM requires with several groups. Before it
links or pulls, a decode compares the prefill's compatibility record with its own (model, KV
dtype, block size, layout, KV heads, head size, groups, wire version) and refuses a mismatch
naming both values. Not supported: different block sizes (refused), pipeline parallelism
(untested).
``python -m hixl.vllm.proxy`` puts one OpenAI endpoint in front of a prefill and a decode
``vllm serve``; docs/vllm.md has the commands.
"""

from typing import Any

__all__ = ["HixlConnector", "HixlConnectorMetadata", "HixlHandshakeMetadata",
           "HixlKVConnectorStats", "HixlPromMetrics"]


def __getattr__(name: str) -> Any:
    # The connector's classes import vLLM; they load when vLLM asks for them, so that the
    # vLLM-free parts of the package (``python -m hixl.vllm.proxy``, ``_geometry``) import
    # without it.
    if name in __all__:
        from . import _connector
        return getattr(_connector, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
