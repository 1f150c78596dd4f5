"""Exits with links and transfers still open: the interpreter must exit cleanly (0, promptly).

Usage: python exit_child.py TRANSPORT TARGET_ENGINE MODE
MODE: "idle" (a link, nothing in flight), "inflight" (transfers posted, not awaited), "async"
(an asyncio task awaiting a transfer when the loop is stopped).
"""

import asyncio
import sys

import hixl


def main() -> None:
    transport, target, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    eng = hixl.Engine("127.0.0.1", {"hixl.Transport": transport})
    local = bytearray(b"e" * (16 << 20))
    reg = eng.register(local)
    peer = eng.connect(target).wait()
    remote = peer.region("buf")
    if mode == "inflight":
        ops = [peer.write([(reg.addr, remote.addr, 4 << 20)]) for _ in range(8)]
        _ = ops
    elif mode == "async":
        async def go() -> None:
            t = asyncio.ensure_future(peer.write([(reg.addr, remote.addr, 16 << 20)]))
            await asyncio.sleep(0)
            _ = t
        loop = asyncio.new_event_loop()
        loop.run_until_complete(go())
    print("posted", flush=True)
    # No close, no deregister: exit with everything open.


if __name__ == "__main__":
    main()
