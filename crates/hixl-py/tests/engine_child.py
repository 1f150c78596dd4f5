"""A target process for the engine tests: registers a region, then obeys JSON lines on stdin.

Usage: python engine_child.py TRANSPORT SIZE [pooled]
Prints one JSON line {"engine": addr, "name": "buf"}; then for each command line prints one
JSON answer line.
"""

import hashlib
import json
import os
import sys

import hixl


def main() -> None:
    transport, size = sys.argv[1], int(sys.argv[2])
    pooled = len(sys.argv) > 3 and sys.argv[3] == "pooled"
    eng = hixl.Engine("127.0.0.1:0", {"hixl.Transport": transport})
    if pooled:
        region = eng.register_pooled(size, name="buf")
        buf = None
    else:
        buf = bytearray(size)
        region = eng.register(buf, name="buf")
    peers = {}

    def read(off: int, n: int) -> bytes:
        return region.read(off, n)

    print(json.dumps({"engine": eng.local_engine, "name": "buf", "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        c = json.loads(line)
        cmd = c["cmd"]
        out = {"ok": True}
        if cmd == "fill":
            region.write(c["off"], bytes([c["byte"]]) * c["len"])
        elif cmd == "pattern":
            data = bytes((c["seed"] + i * 7) & 0xFF for i in range(c["len"]))
            region.write(c["off"], data)
        elif cmd == "digest":
            out["sha"] = hashlib.sha256(read(c["off"], c["len"])).hexdigest()
        elif cmd == "count":
            out["n"] = read(c["off"], c["len"]).count(bytes([c["byte"]]))
        elif cmd == "notifies":
            out["notifies"] = [[n.sender, n.name.decode(), n.msg.decode()] for n in eng.take_notifies()]
        elif cmd == "connect":
            peers[c["to"]] = eng.connect(c["to"]).wait()
        elif cmd == "notify":
            peers[c["to"]].notify(c["name"], c["msg"]).wait()
        elif cmd == "exit":
            print(json.dumps(out), flush=True)
            break
        print(json.dumps(out), flush=True)
    eng.close()


if __name__ == "__main__":
    main()
