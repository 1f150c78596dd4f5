"""Fixtures: a target engine in a child Python process, driven over its stdin."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

HERE = Path(__file__).resolve().parent
TRANSPORTS = ["tcp", "fabric"]


def sigstop(pid: int, timeout: float = 5.0) -> None:
    """SIGSTOPs `pid` and returns once every thread of it is stopped: `kill` only sends the
    signal, and a thread still running on another vCPU could serve one more request."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                continue  # a thread that just ended
        if states and all(st in ("T", "t") for st in states):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"pid {pid} not stopped after {timeout}s: thread states {states}")
        time.sleep(0.001)


class Child:
    """A child process running `script`; JSON lines both ways."""

    def __init__(self, script: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / script), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{script} {args} exited with {self.proc.wait()}")
        self.hello: Dict[str, Any] = json.loads(line)

    def ask(self, **cmd: Any) -> Dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"child exited with {self.proc.wait()} on {cmd}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.ask(cmd="exit")
            except Exception:  # noqa: BLE001
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def spawn() -> Iterator[Any]:
    children: List[Child] = []

    def make(script: str, *args: str) -> Child:
        c = Child(script, *args)
        children.append(c)
        return c

    yield make
    for c in children:
        c.close()


def pytest_configure(config: Any) -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
