"""Rust's log records in Python's logging, under the `hixl` loggers."""

import logging
import socket
import time

import hixl


def wait_for(caplog, pred, timeout=10.0):
    """The captured records that match `pred`, once there is one (the native side hands them
    to Python from a thread of its own)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        recs = [r for r in caplog.records if pred(r)]
        if recs:
            return recs
        time.sleep(0.01)
    return []


def test_rust_warnings_reach_python_logging(caplog):
    eng = hixl.Engine("127.0.0.1:0", {"hixl.Transport": "tcp"})
    try:
        with caplog.at_level(logging.WARNING, logger="hixl"):
            hixl.reset_log_cache()
            host, port = eng.local_engine.rsplit(":", 1)
            # Not a hello: the engine's server warns and closes the connection.
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(b"\xff" * 64)
                s.recv(1)
            recs = wait_for(caplog, lambda r: r.levelno >= logging.WARNING
                            and r.name.startswith("hixl."))
        assert recs, caplog.records
        r = recs[0]
        assert r.levelno == logging.WARNING
        assert r.name.startswith("hixl.hixl_async."), r.name
        assert "closing connection" in r.getMessage(), r.getMessage()
    finally:
        eng.close()


def test_debug_records_after_a_level_change(caplog):
    with caplog.at_level(logging.DEBUG, logger="hixl"):
        hixl.reset_log_cache()
        eng = hixl.Engine("127.0.0.1:0", {"hixl.Transport": "tcp"})
        try:
            recs = wait_for(caplog, lambda r: r.levelno == logging.DEBUG
                            and r.name.startswith("hixl.hixl_async.engine"))
            assert recs, [(r.name, r.getMessage()) for r in caplog.records]
        finally:
            eng.close()
    hixl.reset_log_cache()
