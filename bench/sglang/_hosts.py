"""``pd_harness.py --hosts``: the harness with its prefill and decode on different hosts of the
rig ``tools/hosts.sh`` makes (network namespaces on one machine, each with its own address,
joined by a bridge, never by ``lo``). The prefill server's processes (its bootstrap server and
its scheduler ranks) run in host h1, the decode ranks in h2; the driver stays where it was
started (it only reads the ranks' pipes, it never touches the network between them).

Nothing names an address but what a deployment without a default route names: SGLang's own
``SGLANG_HOST_IP`` per host (hixl advertises SGLang's address) and the bootstrap address the
decode reaches. hixl listens on a fixed data port (``HIXL_SGLANG_PORT``, the same on both
hosts). The checks: every rank's engine advertises its host's address, never loopback; the
decode got the prefill's side-channel address from the bootstrap server; the prefill's links
to the decode run over tcp (the fabric is for processes of one host).

The rig: the caller's when ``HIXL_HOSTS`` is set (``tools/hosts.sh run 2 -- ...``), else one
brought up here with the prefix ``HIXL_HOSTS_PREFIX`` (default ``hxsg``) and taken down on
every exit.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[2]
HOSTS_SH = str(ROOT / "tools" / "hosts.sh")
#: where each role runs
HOST_OF = {"bootstrap": "h1", "prefill": "h1", "decode": "h2"}
DATA_PORT = "17400"


class Rig:
    """The hosts the ranks run in; a context manager that removes a rig it made."""

    def __init__(self) -> None:
        self.prefix = os.environ.setdefault("HIXL_HOSTS_PREFIX", "hxsg")
        self.net = os.environ.get("HIXL_HOSTS_NET", "192.0.2")
        self.own = not os.environ.get("HIXL_HOSTS")
        self._old: Dict[int, Any] = {}

    def __enter__(self) -> "Rig":
        # SIGTERM ends the driver through its cleanup, as Ctrl-C does
        self._old[signal.SIGTERM] = signal.signal(signal.SIGTERM, _exit_on_signal)
        if self.own:
            self._sh("up", "2")
        else:
            for h in ("h1", "h2"):
                self._sh("addr", h)  # fails naming the host if the caller's rig lacks it
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.own:
            self._sh("down")
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _sh(self, *args: str) -> str:
        r = subprocess.run([HOSTS_SH, *args], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"tools/hosts.sh {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout.strip()

    def addr(self, role: str) -> str:
        return f"{self.net}.{HOST_OF[role][1:]}"

    def wrap(self, role: str) -> List[str]:
        """The command prefix that runs a process of ``role`` in its host."""
        return [HOSTS_SH, "exec", HOST_OF[role]]

    def env(self, role: str, env: Dict[str, str]) -> Dict[str, str]:
        e = dict(env)
        e["SGLANG_HOST_IP"] = self.addr(role)  # SGLang's address (no default route here)
        e.setdefault("HIXL_SGLANG_PORT", DATA_PORT)
        return e


def _exit_on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def check(rig: Rig, ranks: List[Any]) -> List[str]:
    """What the ranks reported about their addresses and links, as problems."""
    problems: List[str] = []
    decode_addr = rig.addr("decode")
    for r in ranks:
        want = rig.addr(r.role)
        eng = [e for e in r.lines if e.get("event") == "engine"]
        if not eng:
            problems.append(f"{r.role} {r.rank}: no engine reported (its log: {r.log})")
            continue
        sid = str(eng[0].get("session"))
        if sid.rpartition(":")[0].strip("[]") != want:
            problems.append(f"{r.role} {r.rank}: its engine advertises {sid}, not {want}:PORT")
        for e in r.lines:
            if e.get("event") == "bootstrap_info" and e.get("rank_ips") != [rig.addr("prefill")]:
                problems.append(f"decode {r.rank}: the bootstrap server gave the prefill's "
                                f"address as {e.get('rank_ips')}, not {rig.addr('prefill')}")
            if e.get("event") != "links":
                continue
            for peer, transport in (e.get("links") or {}).items():
                if peer.rpartition(":")[0].strip("[]") != decode_addr:
                    problems.append(f"{r.role} {r.rank}: linked to {peer}, not to the decode "
                                    f"host {decode_addr}")
                if not str(transport).startswith("tcp"):
                    problems.append(f"{r.role} {r.rank}: the link to {peer} runs over "
                                    f"{transport!r}, not tcp")
    seen = [r for r in ranks if r.role == "prefill"
            and any(e.get("event") == "links" and e.get("links") for e in r.lines)]
    if not seen:
        problems.append("no prefill rank reported a link to the decode")
    if not any(e.get("event") == "bootstrap_info" for r in ranks for e in r.lines):
        problems.append("no decode rank reported the prefill's address from the bootstrap")
    return problems


def describe(ranks: List[Any]) -> str:
    """One line: each rank's advertised session and the prefill's links."""
    parts = []
    for r in ranks:
        eng = next((e for e in r.lines if e.get("event") == "engine"), {})
        links: Dict[str, str] = {}
        for e in r.lines:
            if e.get("event") == "links":
                links.update(e.get("links") or {})
        parts.append(f"{r.role} {r.rank} {eng.get('session')}"
                     + (f" -> {', '.join(f'{p} over {t.split()[0]}' for p, t in links.items())}"
                        if links else ""))
    return "; ".join(parts)
