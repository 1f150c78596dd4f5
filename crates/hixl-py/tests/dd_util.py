"""Helpers of the llm_datadist tests: a peer process (tests/dd_peer.py) driven over its stdin
and stdout, the test's own cluster, and the block pattern both sides fill and check."""

import json
import os
import select
import socket
import subprocess
import sys
import time

import numpy as np

from hixl.llm_datadist import (BlocksCacheKey, CacheDesc, DataType, LLMClusterInfo, LLMConfig,
                               LLMDataDist, LLMRole, Placement)

HERE = os.path.dirname(os.path.abspath(__file__))


def value(seed, t, b):
    """The value every element of block ``b`` of tensor ``t`` holds (float32-exact)."""
    return float(seed * 100000 + t * 1000 + b)


def filled(seed, tensors, blocks, elems):
    out = []
    for t in range(tensors):
        a = np.empty((blocks, elems), np.float32)
        for b in range(blocks):
            a[b] = value(seed, t, b)
        out.append(a)
    return out


def digest(arrs):
    out = []
    for a in arrs:
        out.append([float(blk[0]) if (blk == blk[0]).all() else None
                    for blk in a.reshape(a.shape[0], -1)])
    return out


class Lines:
    """Reads lines from a pipe with a deadline."""

    def __init__(self, f):
        self.fd = f.fileno()
        self.buf = b""

    def read(self, timeout):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no line in {timeout} s (have {self.buf!r})")
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    raise EOFError(f"pipe closed (have {self.buf!r})")
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()


class Peer:
    """A tests/dd_peer.py process: one cluster with caches src, recv, cont, cont_recv."""

    def __init__(self, cluster=1, transport="tcp", layers=4, blocks=16, elems=64, seed=11,
                 sync_ms=5000):
        self.cfg = dict(cluster=cluster, transport=transport, layers=layers, blocks=blocks,
                        elems=elems, seed=seed, sync_ms=sync_ms)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "dd_peer.py"), json.dumps(self.cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.out = Lines(self.proc.stdout)
        try:
            hello = json.loads(self.out.read(30))
        except (EOFError, TimeoutError):
            self.proc.kill()
            raise AssertionError(f"peer did not start: {self.proc.stderr.read().decode()}")
        self.addr = hello["ready"]
        self.ids = hello["ids"]
        self.addrs = hello["addrs"]
        self.cluster = cluster

    def ask(self, timeout=30, **cmd):
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()
        return json.loads(self.out.read(timeout))

    def digest(self, cache):
        return self.ask(op="digest", cache=cache)["digest"]

    def info(self, cluster=None):
        ci = LLMClusterInfo()
        ci.remote_cluster_id = self.cluster if cluster is None else cluster
        ci.remote_role_type = LLMRole.PROMPT
        ip, port = self.addr.rsplit(":", 1)
        ci.append_local_ip_info("127.0.0.1", 0)
        ci.append_remote_ip_info(ip, int(port))
        return ci

    def close(self, finalize=True):
        if self.proc.poll() is None:
            try:
                self.ask(op="exit", finalize=finalize, timeout=10)
            except (EOFError, TimeoutError, BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            f.close()


def local(cluster=2, transport="tcp", sync_ms=5000, role=LLMRole.DECODER):
    """This process's cluster, listening on a free port."""
    dd = LLMDataDist(role, cluster)
    c = LLMConfig()
    c.device_id = 0
    c.listen_ip_info = "127.0.0.1:0"
    c.sync_kv_timeout = sync_ms
    c.enable_cache_manager = True
    c.ge_options = {"hixl.Transport": transport}
    dd.init(c.generate_options())
    return dd


def blocks_cache(dd, arrs, model_id=0, key=True):
    desc = CacheDesc(len(arrs), list(arrs[0].shape), DataType.DT_FLOAT, placement=Placement.HOST)
    k = BlocksCacheKey(dd.cluster_id, model_id) if key else None
    return dd.cache_manager.register_blocks_cache(desc, [a.ctypes.data for a in arrs], k)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
