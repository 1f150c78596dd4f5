"""Typed exceptions for what goes wrong with a peer, with real engines over loopback."""

import os
import signal

import pytest

import hixl
from conftest import sigstop

MiB = 1 << 20


def target_pair(spawn, size=64 * MiB, options=None):
    child = spawn("engine_child.py", "tcp", str(size))
    eng = hixl.Engine("127.0.0.1:0", {"hixl.Transport": "tcp", **(options or {})})
    peer = eng.connect(child.hello["engine"], timeout=5.0).wait()
    src = bytearray(size)
    return child, eng, peer, peer.region("buf"), eng.register(src), src


def test_mismatched_secrets_raise_auth_error():
    tgt = hixl.Engine("127.0.0.1:0", {"hixl.AuthSecret": "s" * 32})
    eng = hixl.Engine("127.0.0.1:0", {"hixl.AuthSecret": "t" * 32})
    try:
        with pytest.raises(hixl.AuthError) as e:
            eng.connect(tgt.local_engine, timeout=5.0).wait(10)
        assert isinstance(e.value, hixl.FailedError) and isinstance(e.value, PermissionError)
        assert e.value.peer == tgt.local_engine
        assert e.value.cause and e.value.cause in str(e.value)
    finally:
        eng.close()
        tgt.close()


def test_a_killed_peer_raises_peer_lost(spawn):
    child, eng, peer, rr, reg, _ = target_pair(spawn)
    try:
        # Stopped first, so that the write is still in flight when the peer dies.
        sigstop(child.proc.pid)
        t = peer.write([(reg.addr, rr.addr, 64 * MiB)])
        child.proc.kill()
        child.proc.wait()
        with pytest.raises(hixl.PeerLostError) as e:
            t.wait(10)
        assert not isinstance(e.value, hixl.HeartbeatLostError)
        # the classes an older `except` names still catch it
        assert isinstance(e.value, hixl.FailedError) and isinstance(e.value, ConnectionError)
        assert e.value.peer == child.hello["engine"]
        assert e.value.cause and e.value.cause in str(e.value)
    finally:
        eng.close()


def test_a_silent_peer_raises_heartbeat_lost(spawn):
    opts = {"hixl.HeartbeatIntervalMs": "50", "hixl.HeartbeatMissLimit": "2"}
    child, eng, peer, rr, reg, _ = target_pair(spawn, options=opts)
    try:
        sigstop(child.proc.pid)
        try:
            t = peer.write([(reg.addr, rr.addr, 64 * MiB)])
            with pytest.raises(hixl.HeartbeatLostError) as e:
                t.wait(10)
        finally:
            os.kill(child.proc.pid, signal.SIGCONT)
        assert isinstance(e.value, hixl.PeerLostError) and isinstance(e.value, hixl.FailedError)
        assert e.value.peer == child.hello["engine"]
        assert "heartbeat" in e.value.cause
    finally:
        eng.close()


def test_an_op_past_its_timeout_raises_transfer_timeout(spawn):
    child, eng, peer, rr, reg, _ = target_pair(spawn)
    try:
        sigstop(child.proc.pid)
        try:
            t = peer.write([(reg.addr, rr.addr, 64 * MiB)], timeout=0.2)
            with pytest.raises(hixl.TransferTimeoutError) as e:
                t.wait()
        finally:
            os.kill(child.proc.pid, signal.SIGCONT)
        assert isinstance(e.value, hixl.HixlTimeoutError) and isinstance(e.value, TimeoutError)
        assert e.value.status == 103901
        assert e.value.peer == child.hello["engine"]
        assert "timed out" in e.value.cause
    finally:
        eng.close()


def test_a_refusal_is_both_refused_and_its_status_class():
    # The native module's call for a peer's refusal (hixl_core's Error::Remote): no request
    # the engine makes over loopback is refused this way by a well-behaved peer.
    e = hixl._errors._make(103900, "PARAM_INVALID", "x refused the request", None,
                           "refused", "127.0.0.1:9", "no such thing")
    assert isinstance(e, hixl.RefusedError) and isinstance(e, hixl.ParamInvalidError)
    assert (e.peer, e.cause, e.status) == ("127.0.0.1:9", "no such thing", 103900)
    again = hixl._errors._make(103900, "PARAM_INVALID", "y", None, "refused", "p", "c")
    assert type(again) is type(e)
    failed = hixl._errors._make(503900, "FAILED", "z", None, "refused", "p", "c")
    assert isinstance(failed, hixl.RefusedError) and isinstance(failed, hixl.FailedError)


def test_a_missing_region_names_the_ones_there(spawn):
    child, eng, peer, rr, reg, _ = target_pair(spawn, size=MiB)
    try:
        with pytest.raises(KeyError) as e:
            peer.region("nope")
        assert "'nope'" in str(e.value) and "'buf'" in str(e.value)
    finally:
        eng.close()
