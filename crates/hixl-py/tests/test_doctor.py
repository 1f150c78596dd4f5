"""hixl.Engine.doctor(): `hixl doctor --peer PEER --json` on the calling engine, against a peer
engine in this process and against `hixl doctor --serve` (the CLI binary, when built)."""

import asyncio
import os
import socket
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

import hixl

ROOT = Path(__file__).resolve().parents[3]
MiB = 1 << 20
QUICK = dict(size=MiB, block=256 << 10, duration=0.05)


def errors(report: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [f for f in report["findings"] if f["severity"] == "error"]


def hixl_binary() -> Optional[Path]:
    """The `hixl` CLI of `cargo build -p hixl-cli` (debug or release), if there is one."""
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    for profile in ("debug", "release"):
        b = target / profile / "hixl"
        if b.is_file() and os.access(b, os.X_OK):
            return b
    return None


@pytest.fixture
def peer() -> Iterator[hixl.Engine]:
    """A listening engine with a writable region for the probe: no side endpoint."""
    e = hixl.Engine("127.0.0.1:0")
    # Kept for the engine's life: the probe writes into it.
    region = e.register(bytearray(4 * MiB), name="kv")
    yield e
    e.close()
    del region


def test_a_peer_engine_in_this_process(peer: hixl.Engine) -> None:
    e = hixl.Engine("127.0.0.1")
    try:
        r = e.doctor(peer.local_engine, **QUICK)
        assert r["ok"] is True, r
        assert errors(r) == [], r
        f = r["facts"]
        assert f["peer"] == peer.local_engine and f["peer_addrs"] == [peer.local_engine]
        assert f["local"]["advertised"] == "127.0.0.1"
        assert f["transport"], r
        assert f["probe"]["hixl_gbps"] > 0, r
        # No `hixl doctor --serve` there: its end is unknown (a note, not an error).
        assert [x["code"] for x in r["findings"]] == ["no-peer-facts"], r

        bad = e.doctor(peer.local_engine, expect="verbs", probe=False)
        assert bad["ok"] is False and bad["facts"]["probe"] is None, bad
        assert [x["code"] for x in errors(bad)] == ["unexpected-transport"], bad
        assert "where verbs was expected" in errors(bad)[0]["what"], bad
    finally:
        e.close()


def test_a_link_already_up_is_used_and_left_up(peer: hixl.Engine) -> None:
    e = hixl.Engine("127.0.0.1")
    try:
        assert e.peers() == []
        # A link the doctor opens is closed again.
        assert e.doctor(peer.local_engine, probe=False)["ok"] is True
        assert e.peers() == []

        async def link() -> None:
            await e.connect(peer.local_engine)

        asyncio.run(link())
        r = e.doctor(peer.local_engine, **QUICK)
        assert r["ok"] is True and r["facts"]["connect_error"] is None, r
        assert e.peer(peer.local_engine).is_connected
    finally:
        e.close()


def test_bad_arguments_name_the_value(peer: hixl.Engine) -> None:
    e = hixl.Engine("127.0.0.1")
    try:
        cases = [
            (dict(expect="rdma"), "rdma"),
            (dict(size=-1), "-1"),
            (dict(block=100), "100"),
            (dict(duration=0.0), "duration"),
            (dict(duration=float("nan")), "NaN"),
            (dict(size=4 << 30), "size"),
        ]
        for kw, named in cases:
            with pytest.raises(hixl.ParamInvalidError, match=named):
                e.doctor(peer.local_engine, **kw)  # type: ignore[arg-type]
        with pytest.raises(hixl.ParamInvalidError, match="prefill-0"):
            e.doctor("prefill-0")
    finally:
        e.close()


def test_unreachable_is_a_finding() -> None:
    e = hixl.Engine("127.0.0.1")
    try:
        # A port nothing listens on (bound, never listened).
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            addr = "127.0.0.1:%d" % s.getsockname()[1]
            r = e.doctor(addr)
        assert r["ok"] is False and r["facts"]["connect_error"], r
        assert [x["code"] for x in errors(r)] == ["unreachable"], r
    finally:
        e.close()


@pytest.fixture
def served() -> Iterator[str]:
    """`hixl doctor --serve` on loopback: its engine's address."""
    b = hixl_binary()
    if b is None:
        pytest.skip("no hixl CLI binary: run `cargo build -p hixl-cli` (target/debug/hixl, "
                    "or under CARGO_TARGET_DIR)")
    p = subprocess.Popen([str(b), "doctor", "--serve", "--listen", "127.0.0.1:0", "--mem", "8M"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line.startswith("LISTENING"):
            p.kill()
            _, err = p.communicate(timeout=10)
            pytest.fail(f"hixl doctor --serve printed {line!r}; stderr: {err}")
        fields = dict(kv.split("=", 1) for kv in line.split()[1:])
        yield fields["engine"]
    finally:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_against_hixl_doctor_serve(served: str) -> None:
    e = hixl.Engine("127.0.0.1")
    try:
        r = e.doctor(served, **QUICK)
        # A debug build's serving end can make hixl look slow next to raw TCP (`slow-path`);
        # nothing else may be named.
        debug = "debug" in str(hixl_binary())
        named = [x for x in r["findings"] if not (debug and x["code"] == "slow-path")]
        assert named == [], r
        f = r["facts"]
        assert f["remote"]["advertised"] == served and f["remote"]["route_if"], r
        assert f["local"]["mtu"] == f["remote"]["mtu"], r
        assert f["probe"]["hixl_gbps"] > 0 and f["probe"]["tcp_gbps"] > 0, r

        bad = e.doctor(served, expect="verbs", probe=False)
        assert bad["ok"] is False, bad
        assert [x["code"] for x in bad["findings"]] == ["unexpected-transport"], bad
        assert bad["findings"][0]["what"].startswith(f["transport"].split()[0] + " where verbs")
    finally:
        e.close()
