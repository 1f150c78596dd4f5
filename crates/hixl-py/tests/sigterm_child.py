"""Publishes an engine by name, then waits to be stopped: SIGTERM must end it cleanly (exit 0,
its directory entry withdrawn at once).

Usage: python sigterm_child.py ETCD_URL NAME KIND   (KIND: "engine" or "datadist")
"""

import sys
import threading

import hixl
from hixl.llm_datadist import LLMDataDist, LLMRole


def main() -> None:
    url, name, kind = sys.argv[1], sys.argv[2], sys.argv[3]
    opts = {"hixl.Directory": url, "hixl.Name": name, "hixl.DirectoryTtlSec": "30"}
    if kind == "engine":
        keep = hixl.Engine("127.0.0.1:0", opts)
    else:
        keep = LLMDataDist(LLMRole.PROMPT, 1)
        keep.init({"llm.listenIpInfo": "127.0.0.1:0", **opts})
    print("READY", flush=True)
    threading.Event().wait()
    _ = keep


if __name__ == "__main__":
    main()
