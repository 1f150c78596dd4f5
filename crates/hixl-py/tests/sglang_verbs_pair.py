"""SGLang's transfer engine over RDMA verbs, configured as an operator configures the SGLang
backend: ``HixlTransferEngine`` (hixl.sglang's engine, what SGLang's KV manager calls) in a
decode process that registers a KV pool, and in a prefill process (this one) that WRITEs pages
into it with ``batch_transfer_sync``, both set up by the connectors' network settings from the
environment: ``HIXL_SGLANG_TRANSPORT=verbs``, ``HIXL_SGLANG_VERBS_DEVICES`` (the rails),
``HIXL_SGLANG_INTERFACE`` (the advertised address) and ``HIXL_SGLANG_PORT`` (a fixed port).
Every page is checked in the decode's pool. Exits 0 only when every byte landed and the link
says verbs.

    HIXL_VERBS_DEVICE=rxe0 python3 sglang_verbs_pair.py      # e.g. in the Soft-RoCE guest

``HIXL_PAIR_TRANSPORT`` (default ``verbs``) and ``HIXL_PAIR_MODULES`` as in verbs_pair.py.
"""

import ctypes
import json
import os
import sys
import time

from hixl import _netconf
from hixl.sglang._engine import HixlTransferEngine, settings

from _pair import record_modules, start_half

PAGE = 64 << 10  # one page of KV: 64 KiB
PAGES = 48  # the pool; the prefill writes every other page, in reverse order
TIMEOUT = 60.0


def env_settings() -> dict:
    want = os.environ.get("HIXL_PAIR_TRANSPORT", "verbs")
    env = dict(os.environ, HIXL_SGLANG_TRANSPORT=want, HIXL_SGLANG_PORT="27600")
    if want == "verbs":
        env.setdefault("HIXL_SGLANG_VERBS_DEVICES", os.environ.get("HIXL_VERBS_DEVICE", "rxe0"))
    return settings(env)


def options(net: dict) -> dict:
    o = _netconf.engine_options(net)
    if net["transport"] == "verbs":
        # Soft-RoCE under TCG: a try outlasts the default ACK timeout (as in verbs_pair.py)
        o["hixl.VerbsTimeout"] = "18"
    return o


def page(i: int) -> bytes:
    return bytes(((i * 7 + j) % 253) for j in range(256)) * (PAGE // 256)


def decode() -> None:
    net = env_settings()
    eng = HixlTransferEngine("", options(net), net=net, rank=1, role="d")
    pool = bytearray(PAGES * PAGE)
    base = ctypes.addressof((ctypes.c_char * len(pool)).from_buffer(pool))
    if eng.batch_register([base], [len(pool)]) != 0:
        raise SystemExit("decode: registering the pool failed")
    print(json.dumps({"session": eng.get_session_id(), "base": base}), flush=True)
    sys.stdin.readline()  # the prefill is done
    bad = [i for i in range(PAGES)
           if pool[i * PAGE:(i + 1) * PAGE] != (page(i) if i % 2 else bytes(PAGE))]
    print(json.dumps({"bad_pages": bad}), flush=True)
    record_modules()
    eng.batch_deregister([base])
    eng.close()


def prefill() -> int:
    t0 = time.monotonic()
    child, hello = start_half(__file__, "--decode", "session")
    assert child.stdin is not None and child.stdout is not None
    if hello is None:
        print(f"sglang_verbs_pair: the decode did not start (exit {child.wait()})")
        return 1
    net = env_settings()
    eng = HixlTransferEngine("", options(net), net=net, rank=0, role="p")
    src = bytearray(b"".join(page(i) for i in range(PAGES)))
    sbase = ctypes.addressof((ctypes.c_char * len(src)).from_buffer(src))
    failures = []
    if eng.batch_register([sbase], [len(src)]) != 0:
        failures.append("registering the prefill's pages failed")
    session, dbase = hello["session"], int(hello["base"])
    odd = [i for i in reversed(range(PAGES)) if i % 2]
    rc = eng.batch_transfer_sync(session, [sbase + i * PAGE for i in odd],
                                 [dbase + i * PAGE for i in odd], [PAGE] * len(odd))
    if rc != 0:
        failures.append(f"batch_transfer_sync returned {rc}: {eng.last_error(session)}")
    want = os.environ.get("HIXL_PAIR_TRANSPORT", "verbs")
    peer = eng._peers.get(session)
    transport = peer.transport if peer is not None else "?"
    if not transport.startswith(want):
        failures.append(f"the link is {transport!r}, not {want}")
    if not session.endswith(":27601"):
        failures.append(f"the decode's session {session} is not on its fixed port 27601")
    child.stdin.write("done\n")
    child.stdin.flush()
    bad = json.loads(child.stdout.readline() or "{}").get("bad_pages", ["?"])
    if bad:
        failures.append(f"pages wrong in the decode's pool: {bad[:8]}")
    record_modules()
    eng.close()
    child.wait(TIMEOUT)
    for f in failures:
        print(f"sglang_verbs_pair: FAILED: {f}")
    if not failures:
        print(f"sglang_verbs_pair: {len(odd)} pages of {PAGE} B written over {transport} from "
              f"{eng.session_id} to {session}, every page verified "
              f"({time.monotonic() - t0:.2f}s)")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--decode"]:
        decode()
    else:
        sys.exit(prefill())
