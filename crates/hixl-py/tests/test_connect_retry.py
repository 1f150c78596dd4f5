"""Engine.connect(..., retries=, backoff=): tries again while the peer refuses or cannot be
reached, says how many tries after the last, and never retries a final refusal."""

import asyncio
import logging
import socket
import time

import pytest

import hixl


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def retry_records(caplog):
    return [r for r in caplog.records
            if r.name.startswith("hixl.") and "; retry " in r.getMessage()]


def test_refused_tries_are_retried_and_the_last_error_counts_them(caplog):
    eng = hixl.Engine("127.0.0.1", {"hixl.Transport": "tcp"})
    addr = f"127.0.0.1:{free_port()}"  # nothing listens there
    try:
        with pytest.raises(hixl.FailedError) as plain:
            eng.connect(addr, timeout=2.0).wait(10)
        assert "tries" not in str(plain.value)
        with caplog.at_level(logging.INFO, logger="hixl"):
            hixl.reset_log_cache()
            with pytest.raises(hixl.FailedError) as e:
                eng.connect(addr, timeout=2.0, retries=2, backoff=0.01).wait(10)
            msg = str(e.value)
            assert f"connecting to {addr}: 3 tries in" in msg, msg
            assert "refused" in msg.lower(), msg
            assert type(e.value) is type(plain.value)
            deadline = time.monotonic() + 10
            while len(retry_records(caplog)) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)  # the records come from the native logging thread
            recs = retry_records(caplog)
        said = [r.getMessage() for r in recs]
        assert "retry 1 of 2 in 10ms" in said[0] and "retry 2 of 2 in 20ms" in said[1], said
        assert recs[0].levelno == logging.INFO and addr in said[0]
        assert recs[0].name == "hixl.hixl_py.connect", recs[0].name
    finally:
        hixl.reset_log_cache()
        eng.close()


def test_a_peer_that_starts_late_is_reached(caplog):
    port = free_port()
    addr = f"127.0.0.1:{port}"
    eng = hixl.Engine("127.0.0.1", {"hixl.Transport": "tcp"})
    late = None

    async def main():
        nonlocal late
        connecting = asyncio.ensure_future(
            eng.connect(addr, timeout=2.0, retries=1000, backoff=0.005))
        # Start the peer once a try has been refused (the retry's log record says so).
        while not retry_records(caplog):
            assert not connecting.done(), connecting
            await asyncio.sleep(0.005)
        late = hixl.Engine(addr, {"hixl.Transport": "tcp"})
        return await asyncio.wait_for(connecting, 30)

    try:
        with caplog.at_level(logging.INFO, logger="hixl"):
            hixl.reset_log_cache()
            peer = asyncio.run(main())
        assert peer.is_connected and peer.name == addr
    finally:
        hixl.reset_log_cache()
        eng.close()
        if late is not None:
            late.close()


def test_final_errors_are_not_retried():
    target = hixl.Engine("127.0.0.1:0", {"hixl.Transport": "tcp"})
    eng = hixl.Engine("127.0.0.1:0", {"hixl.Transport": "tcp"})
    try:
        eng.connect(target.local_engine, timeout=5.0).wait(10)
        t0 = time.monotonic()
        with pytest.raises(hixl.AlreadyConnectedError) as e:
            eng.connect(target.local_engine, retries=50, backoff=0.2).wait(10)
        assert "tries" not in str(e.value)
        with pytest.raises(hixl.HixlError) as e:
            eng.connect(eng.local_engine, retries=50, backoff=0.2).wait(10)
        assert "tries" not in str(e.value)
        # 50 retries with a 0.2 s backoff would take minutes: neither was retried
        assert time.monotonic() - t0 < 10
    finally:
        eng.close()
        target.close()


def test_bad_retry_arguments_are_refused_naming_them():
    eng = hixl.Engine("127.0.0.1", {"hixl.Transport": "tcp"})
    try:
        for kwargs, exc, says in [
            ({"retries": -1}, hixl.ParamInvalidError, "retries -1"),
            ({"retries": 2.5}, TypeError, "retries must be an int, not float"),
            ({"retries": True}, TypeError, "retries must be an int, not bool"),
            ({"retries": 1, "backoff": float("nan")}, hixl.ParamInvalidError, "backoff nan"),
            ({"retries": 1, "backoff": -0.5}, hixl.ParamInvalidError, "backoff -0.5"),
            ({"retries": 1, "backoff": "1"}, TypeError, "backoff must be a number"),
        ]:
            with pytest.raises(exc) as e:
                eng.connect("127.0.0.1:1", **kwargs)
            assert says in str(e.value), str(e.value)
            assert exc is TypeError or isinstance(e.value, ValueError)
    finally:
        eng.close()
