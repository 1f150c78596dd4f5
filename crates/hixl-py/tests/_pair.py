"""What the two-process pairs of the Soft-RoCE guest share (verbs_pair.py,
sglang_verbs_pair.py): the other half started as a child speaking JSON lines, and the record of
the modules a process loaded (``HIXL_PAIR_MODULES``: tools/guest-python.sh copies exactly
those files into the guest)."""

import json
import os
import subprocess
import sys
from typing import Optional, Tuple


def record_modules() -> None:
    """Appends the file of every module this process loaded to ``$HIXL_PAIR_MODULES``."""
    out = os.environ.get("HIXL_PAIR_MODULES")
    if out:
        files = sorted({m.__file__ for m in list(sys.modules.values())
                        if getattr(m, "__file__", None)})
        with open(out, "a") as f:
            f.write("".join(p + "\n" for p in files))


def start_half(script: str, flag: str, key: str) -> Tuple[subprocess.Popen, Optional[dict]]:
    """Starts ``script flag`` as a child with pipes; its first line (JSON) when it holds
    ``key``, else None (the child did not start)."""
    child = subprocess.Popen([sys.executable, script, flag], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, bufsize=1)
    assert child.stdin is not None and child.stdout is not None
    hello = json.loads(child.stdout.readline() or "{}")
    return child, (hello if key in hello else None)
