"""Engines by name through a real etcd (``hixl.Directory``): publish, find, connect, refuse a
taken name, delete on close. Skipped without ``etcd`` unless HIXL_REQUIRE_ETCD=1."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

import hixl


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def etcd():
    if shutil.which("etcd") is None:
        if os.environ.get("HIXL_REQUIRE_ETCD") == "1":
            pytest.fail("HIXL_REQUIRE_ETCD=1 but etcd is not installed (Debian: etcd-server)")
        pytest.skip("etcd is not installed (Debian: etcd-server)")
    client, peer = free_port(), free_port()
    data = tempfile.mkdtemp(prefix="hixl-etcd-")
    proc = subprocess.Popen(
        ["etcd", "--name", "m0", "--data-dir", data,
         f"--listen-client-urls=http://127.0.0.1:{client}",
         f"--advertise-client-urls=http://127.0.0.1:{client}",
         f"--listen-peer-urls=http://127.0.0.1:{peer}",
         f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
         f"--initial-cluster=m0=http://127.0.0.1:{peer}", "--log-level", "warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=1).read()
            if b'"health":"true"' in body:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "etcd did not become healthy"
        time.sleep(0.05)
    try:
        yield f"etcd://127.0.0.1:{client}"
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(data, ignore_errors=True)


def until(what, f, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not f():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.01)


def test_connect_by_name_and_the_lifecycle_of_an_entry(etcd):
    target = hixl.Engine("127.0.0.1:0", {"hixl.Directory": etcd, "hixl.Name": "py-prefill",
                                         "hixl.DirectoryTtlSec": "5"})
    buf = bytearray(1 << 20)
    target.register(buf, access=hixl.Access.REMOTE_RW, name="kv")
    me = hixl.Engine("127.0.0.1", {"hixl.Directory": etcd})
    try:
        pub = target.publication()
        assert pub["name"] == "py-prefill" and pub["state"] == "live", pub
        until("listed", lambda: [e["name"] for e in me.directory_entries()] == ["py-prefill"])
        peer = me.connect_named("py-prefill", timeout=5.0).wait()
        assert f"{peer.incarnation:016x}" == pub["incarnation"]
        src = bytearray(os.urandom(65536))
        reg = me.register(src, access=hixl.Access.LOCAL)
        kv = peer.region("kv")
        peer.write([(reg.addr, kv.addr, len(src))]).wait(5)
        assert bytes(buf[:65536]) == bytes(src)
        # A name nobody holds, and a name already held, are refused naming them.
        with pytest.raises(hixl.HixlError, match="py-nobody"):
            me.connect_named("py-nobody", timeout=2.0).wait()
        with pytest.raises(hixl.HixlError, match=pub["incarnation"]):
            hixl.Engine("127.0.0.1:0", {"hixl.Directory": etcd, "hixl.Name": "py-prefill"})
        # Closing deletes the entry at once (the lease is 5 s).
        t0 = time.monotonic()
        target.close()
        until("deleted", lambda: me.directory_entries() == [], timeout=3.0)
        assert time.monotonic() - t0 < 2.0
    finally:
        me.close()
        target.close()


@pytest.mark.parametrize("kind", ["engine", "datadist"])
def test_sigterm_withdraws_the_entry_at_once(etcd, kind):
    """SIGTERM (Kubernetes, systemd, docker stop) ends a Python process with an engine, or an
    LLMDataDist, cleanly: exit 0 and its entry withdrawn at once, not after its 30 s TTL."""
    me = hixl.Engine("127.0.0.1", {"hixl.Directory": etcd})
    child = subprocess.Popen(
        [sys.executable, os.path.join(os.path.dirname(__file__), "sigterm_child.py"), etcd,
         f"py-term-{kind}", kind],
        stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "READY"
        until("listed", lambda: [e["name"] for e in me.directory_entries()]
              == [f"py-term-{kind}"])
        t0 = time.monotonic()
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=10) == 0
        until("withdrawn", lambda: me.directory_entries() == [], timeout=5.0)
        assert time.monotonic() - t0 < 3.0
    finally:
        child.kill()
        child.wait()
        me.close()
