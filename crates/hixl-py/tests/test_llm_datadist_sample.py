"""A script written against the documented ``llm_datadist`` usage (tests/dd_sample.py, which
names hixl only in its import line) runs as prompt and decoder in two processes and checks
every block of every flow."""

import os
import subprocess
import sys

import pytest

from dd_util import HERE, Lines, free_port


@pytest.mark.parametrize("transport", ["tcp", "fabric", ""])
def test_documented_usage_runs_unchanged(transport):
    pp, dp = free_port(), free_port()
    procs = {}
    for role, (mine, theirs) in (("p", (pp, dp)), ("d", (dp, pp))):
        cmd = [sys.executable, os.path.join(HERE, "dd_sample.py"), "--role", role,
               "--local_port", str(mine), "--remote_port", str(theirs)]
        if transport:
            cmd += ["--transport", transport]
        procs[role] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE)
    lines = {r: Lines(p.stdout) for r, p in procs.items()}
    seen = {r: [] for r in procs}
    try:
        for n in range(1, 5):
            for r in procs:
                while True:
                    line = lines[r].read(30)
                    seen[r].append(line)
                    if line.startswith("BARRIER"):
                        assert line == f"BARRIER {n}"
                        break
            for p in procs.values():
                p.stdin.write(b"go\n")
                p.stdin.flush()
        for r, p in procs.items():
            while True:
                line = lines[r].read(30)
                seen[r].append(line)
                if line == "SAMPLE DONE":
                    break
            assert p.wait(30) == 0
    except BaseException:
        for r, p in procs.items():
            p.kill()
            print(r, seen[r], p.stderr.read().decode(), file=sys.stderr)
        raise
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
            for f in (p.stdin, p.stdout, p.stderr):
                f.close()
    assert [s for s in seen["p"] if s.startswith("CHECKED")] == [
        "CHECKED prompt inbox (push_blocks) 96 blocks",
        "CHECKED prompt cache (unchanged) 96 blocks"]
    assert [s for s in seen["d"] if s.startswith("CHECKED")] == [
        "CHECKED decoder cache (pull_blocks) 96 blocks",
        "CHECKED decoder layered cache (transfer_cache_async) 96 blocks"]
