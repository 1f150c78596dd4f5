"""A Python engine pair that moves bytes over RDMA verbs: this process (the initiator) starts a
copy of itself as the target, connects with ``hixl.Transport=verbs``, READs the target's
pattern, WRITEs its own, has the target check it, and sends a notify. Exits 0 only when every
byte is verified and the link says verbs.

    HIXL_VERBS_DEVICE=rxe0 python3 verbs_pair.py        # e.g. in the Soft-RoCE guest

Needs only the standard library (no numpy: bytes and the wheel's own region API), so that it
runs in the small Python of ``tools/guest-python.sh``. ``HIXL_PAIR_TRANSPORT`` (default
``verbs``) lets that tool run it over tcp on a host without RDMA, to see what it imports;
``HIXL_PAIR_MODULES=file`` appends the files of every module each process loaded to ``file``.
"""

import json
import os
import sys
import time

import hixl

from _pair import record_modules, start_half

SIZE = 4 << 20  # 4 MiB: a fraction of a second per direction on Soft-RoCE under TCG
PIECE = 1 << 20  # one descriptor per MiB, so a transfer is a chain of work requests
TIMEOUT = 60.0


def pattern(seed: int, n: int) -> bytes:
    """n bytes that differ per seed and per position (a 251-periodic ramp)."""
    ramp = bytes((seed + i) % 251 for i in range(251))
    return (ramp * (n // 251 + 1))[:n]


def options() -> dict:
    transport = os.environ.get("HIXL_PAIR_TRANSPORT", "verbs")
    opts = {"hixl.Transport": transport}
    if transport == "verbs":
        opts["hixl.VerbsDevice"] = os.environ.get("HIXL_VERBS_DEVICE", "rxe0")
        # Soft-RoCE in a TCG guest moves ~40 MB/s: a try outlasts the default 67 ms ACK timeout
        # under load (the Rust verbs tests use 18 there too, about 1.07 s).
        opts["hixl.VerbsTimeout"] = os.environ.get("HIXL_PAIR_VERBS_TIMEOUT", "18")
    return opts


def target() -> None:
    """Registers a region holding pattern(1), prints its engine, then checks on request."""
    eng = hixl.Engine("127.0.0.1:0", options())
    region = eng.register(bytearray(pattern(1, SIZE)), name="kv")
    print(json.dumps({"engine": eng.local_engine, "info": eng.info()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "check":
            ok = region.read(0, SIZE) == pattern(cmd["seed"], SIZE)
            notes = [(n.name.decode(), n.msg.decode()) for n in eng.take_notifies()]
            print(json.dumps({"ok": ok, "notifies": notes}), flush=True)
        else:
            break
    record_modules()
    eng.close()


def initiator() -> int:
    t0 = time.monotonic()
    child, hello = start_half(__file__, "--target", "engine")
    assert child.stdin is not None and child.stdout is not None
    if hello is None:
        print(f"verbs_pair: the target did not start (exit {child.wait()})")
        return 1

    def ask(**cmd: object) -> dict:
        child.stdin.write(json.dumps(cmd) + "\n")
        child.stdin.flush()
        return json.loads(child.stdout.readline() or "{}")

    eng = hixl.Engine("127.0.0.1", options())
    print(f"verbs_pair: target {hello['engine']} verbs_device={hello['info']['verbs_device']} "
          f"verbs_reason={hello['info']['verbs_reason']}")
    local = eng.register(bytearray(SIZE))
    peer = eng.connect(hello["engine"], timeout=TIMEOUT).wait(TIMEOUT)
    transport = peer.transport
    print(f"verbs_pair: link transport: {transport}")
    want = os.environ.get("HIXL_PAIR_TRANSPORT", "verbs")
    remote = peer.region("kv")
    descs = [(local.addr + o, remote.addr + o, PIECE) for o in range(0, SIZE, PIECE)]

    failures = []
    if not transport.startswith(want):
        failures.append(f"the link is {transport!r}, not {want}")
    peer.read(descs).wait(TIMEOUT)  # the target's pattern(1) into local
    if local.read(0, SIZE) != pattern(1, SIZE):
        failures.append("READ: the bytes read differ from the target's")
    local.write(0, pattern(2, SIZE))
    peer.write(descs).wait(TIMEOUT)  # pattern(2) into the target
    peer.notify("verbs_pair", "written").wait(TIMEOUT)
    answer = ask(cmd="check", seed=2)
    if not answer.get("ok"):
        failures.append("WRITE: the target's region does not hold the bytes written")
    if ["verbs_pair", "written"] not in answer.get("notifies", []):
        failures.append(f"the notify did not arrive after the write: {answer.get('notifies')}")
    ask(cmd="exit")
    record_modules()
    eng.close()
    child.wait(TIMEOUT)
    for f in failures:
        print(f"verbs_pair: FAILED: {f}")
    if not failures:
        print(f"verbs_pair: READ and WRITE of {SIZE} bytes each over {want} verified, notify "
              f"received ({time.monotonic() - t0:.2f}s)")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--target"]:
        target()
    else:
        sys.exit(initiator())
