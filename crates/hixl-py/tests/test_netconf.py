"""The connectors' shared network settings (hixl._netconf): parsing, the option keys they
become, the address a worker advertises, and the refusal of a loopback address across hosts.
The address detection and the fixed port run in hosts of tools/hosts.sh's rig (network
namespaces with their own addresses, no default route), where a process sees only its host's
addresses."""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from hixl import _netconf
from hixl.sglang._engine import HixlTransferEngine, engine_options, settings

HOSTS = Path(__file__).resolve().parents[3] / "tools" / "hosts.sh"


def test_settings_are_checked_and_name_the_bad_value() -> None:
    cases = [
        ({"transport": "rdma"}, "transport = 'rdma'"),
        ({"host": "prefill-0"}, "host = 'prefill-0'"),
        ({"host": "10.0.0.1", "interface": "lo"}, "give one"),
        ({"interface": "no-such-nic0"}, "interface = 'no-such-nic0'"),
        ({"port": 70000}, "port = 70000"),
        ({"port": "x"}, "port = 'x'"),
        ({"verbs_gid_index": 256}, "verbs_gid_index = 256"),
        ({"directory": "http://etcd:2379"}, "directory = 'http://etcd:2379'"),
        ({"name": "prefill"}, "needs a directory"),
    ]
    for given, says in cases:
        with pytest.raises(ValueError) as e:
            _netconf.validate("test", given)
        assert says in str(e.value), (given, str(e.value))


def test_settings_become_engine_options() -> None:
    s = _netconf.validate("test", {
        "transport": "verbs", "verbs_devices": ["rxe0", "rxe1"], "verbs_gid_index": "3",
        "directory": "etcd://192.0.2.4:2379", "name": "p0", "secret": "s", "port": 27000})
    assert _netconf.engine_options(s) == {
        "hixl.Transport": "verbs", "hixl.VerbsDevices": "rxe0,rxe1", "hixl.VerbsGidIndex": "3",
        "hixl.Directory": "etcd://192.0.2.4:2379", "hixl.AuthSecret": "s"}
    assert _netconf.listen_port(s, 0) == 27000 and _netconf.listen_port(s, 3) == 27003
    assert _netconf.listen_port(_netconf.validate("t", {}), 5) == 0
    with pytest.raises(ValueError, match="past 65535"):
        _netconf.listen_port(_netconf.validate("t", {"port": 65535}), 1)


def test_sglang_reads_the_same_names_from_its_environment() -> None:
    env = {"HIXL_SGLANG_TRANSPORT": "tcp", "HIXL_SGLANG_PORT": "27100",
           "HIXL_SGLANG_VERBS_GID_INDEX": "1", "HIXL_SGLANG_SECRET": "k"}
    s = settings(env)
    assert s["port"] == 27100 and s["verbs_gid_index"] == 1
    assert engine_options(env) == {"hixl.Transport": "tcp", "hixl.VerbsGidIndex": "1",
                                   "hixl.AuthSecret": "k"}
    # --disaggregation-ib-device is the devices unless the variable names others
    assert settings({}, ib_device="mlx5_0")["verbs_devices"] == "mlx5_0"
    assert settings({"HIXL_SGLANG_VERBS_DEVICES": "rxe0"}, "mlx5_0")["verbs_devices"] == "rxe0"
    with pytest.raises(ValueError, match="HIXL_SGLANG_PORT = '27x'"):
        settings({"HIXL_SGLANG_PORT": "27x"})


def test_the_host_comes_from_the_settings_then_the_framework() -> None:
    assert _netconf.pick_host({"host": "192.0.2.9"}, "10.0.0.1") == "192.0.2.9"
    assert _netconf.pick_host({"interface": "lo"}, "10.0.0.1") == "127.0.0.1"
    assert _netconf.pick_host({}, "10.0.0.1") == "10.0.0.1"


def test_a_loopback_peer_is_refused_from_a_routable_side() -> None:
    with pytest.raises(ValueError) as e:
        _netconf.check_peer_address("192.0.2.2", "127.0.0.1", "prefill worker 127.0.0.1:26000")
    assert "127.0.0.1" in str(e.value) and "192.0.2.2" in str(e.value)
    _netconf.check_peer_address("127.0.0.1", "127.0.0.1", "x")  # one host: fine
    _netconf.check_peer_address("192.0.2.2", "192.0.2.1", "x")


# In the rig: hosts with their own addresses.

def _have_rig() -> bool:
    return os.geteuid() == 0 and HOSTS.exists()


@pytest.fixture
def rig() -> Iterator[str]:
    if not _have_rig():
        if os.environ.get("HIXL_REQUIRE_NETNS") == "1":
            pytest.fail("HIXL_REQUIRE_NETNS=1 but the rig needs root and tools/hosts.sh")
        pytest.skip("the hosts rig needs root (network namespaces)")
    prefix = f"hxp{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, HIXL_HOSTS_PREFIX=prefix)
    up = subprocess.run([str(HOSTS), "up", "2"], env=env, capture_output=True, text=True)
    if up.returncode != 0:
        if os.environ.get("HIXL_REQUIRE_NETNS") == "1":
            pytest.fail(f"tools/hosts.sh up: {up.stderr}")
        pytest.skip(f"tools/hosts.sh up: {up.stderr.strip()}")
    try:
        yield prefix
    finally:
        subprocess.run([str(HOSTS), "down"], env=env, check=False)


def _in_host(prefix: str, host: str, code: str, **env: str) -> dict:
    """Runs Python ``code`` in ``host``; its last stdout line is JSON."""
    out = subprocess.run(
        [str(HOSTS), "exec", host, sys.executable, "-c", code],
        env=dict(os.environ, HIXL_HOSTS_PREFIX=prefix, **env), capture_output=True, text=True,
        timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_in_a_host_the_routable_address_is_found_and_the_fixed_port_taken(rig: str) -> None:
    got = _in_host(rig, "h1", """
import json
from hixl import _netconf
from hixl.sglang._engine import HixlTransferEngine
e = HixlTransferEngine("127.0.0.1", net={**_netconf.validate("t", {"port": 27300})}, rank=2)
print(json.dumps({"detected": _netconf.pick_host({}), "eth0": _netconf.interface_address("eth0"),
                  "session": e.session_id, "framework": e.host}))
e.close()
""")
    # no default route in a host of the rig: its only non-loopback address
    assert got["detected"] == "192.0.2.1" and got["eth0"] == "192.0.2.1"
    # SGLang's own address wins over detection (the settings name none), the port is fixed
    assert got["session"] == "127.0.0.1:27302"


def test_across_hosts_a_loopback_session_is_refused_naming_both(rig: str) -> None:
    got = _in_host(rig, "h2", """
import json
from hixl import _netconf
from hixl.sglang._engine import HixlTransferEngine
e = HixlTransferEngine("127.0.0.1", net=_netconf.validate("t", {"interface": "eth0"}))
rc = e.send_probe("127.0.0.1:27000")
print(json.dumps({"session": e.session_id, "rc": rc, "why": e.last_error("127.0.0.1:27000")}))
e.close()
""")
    assert got["session"].startswith("192.0.2.2:")
    assert got["rc"] == -1
    assert "127.0.0.1" in got["why"] and "192.0.2.2" in got["why"], got["why"]


def test_across_hosts_the_engines_link_and_write(rig: str) -> None:
    """h1 serves (fixed port 27400 on its eth0 address), h2 writes to it through the link."""
    serve = subprocess.Popen(
        [str(HOSTS), "exec", "h1", sys.executable, "-c", """
import sys, numpy as np
from hixl.sglang._engine import HixlTransferEngine
from hixl import _netconf
e = HixlTransferEngine("127.0.0.1", net=_netconf.validate("t", {"interface": "eth0", "port": 27400}))
buf = np.zeros(1 << 20, dtype=np.uint8)
e.register(buf.ctypes.data, buf.nbytes)
print(e.session_id, buf.ctypes.data, flush=True)
sys.stdin.readline()
print(int(buf.sum()), flush=True)
e.close()
"""], env=dict(os.environ, HIXL_HOSTS_PREFIX=rig), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)
    try:
        assert serve.stdout is not None and serve.stdin is not None
        session, addr = serve.stdout.readline().split()
        assert session == "192.0.2.1:27400"
        got = _in_host(rig, "h2", f"""
import json, numpy as np
from hixl.sglang._engine import HixlTransferEngine
from hixl import _netconf
e = HixlTransferEngine("", net=_netconf.validate("t", {{}}))  # detected
src = np.full(1 << 20, 3, dtype=np.uint8)
e.register(src.ctypes.data, src.nbytes)
rc = e.batch_transfer_sync("{session}", [src.ctypes.data], [{addr}], [src.nbytes])
print(json.dumps({{"rc": rc, "me": e.session_id}}))
e.close()
""")
        assert got == {"rc": 0, "me": got["me"]} and got["me"].startswith("192.0.2.2:")
        serve.stdin.write("\n")
        serve.stdin.flush()
        assert int(serve.stdout.readline()) == 3 << 20
    finally:
        serve.kill()
        serve.wait()
