#!/usr/bin/env python3
"""A host's link with a delay, for tools/hosts.sh where the kernel has no `tc netem`: two TAP
devices, one in the host's namespace (named eth0, holding the host's address) and one in the
switch's (a port of its bridge), and this process between them, holding every frame for the
delay each way. TAP devices without offloads get whole, checksummed frames, so nothing else of
the path changes; a rate cap (tc tbf) applies to them as to the veth they replace.

    hosts-relay.py HOST_NS SWITCH_NS PORT DELAY_MS     # runs until SIGTERM; prints READY

Frames are held in order (one delay each way, a FIFO), so none is reordered. Needs root."""
import ctypes
import fcntl
import os
import select
import signal
import struct
import sys
import time
from collections import deque

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000
CLONE_NEWNET = 0x40000000
libc = ctypes.CDLL(None, use_errno=True)


def enter(ns: str) -> None:
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {ns}")
    finally:
        os.close(fd)


def tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def main() -> int:
    host_ns, sw_ns, port, delay_ms = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    if not 0 <= delay_ms <= 10_000:
        print(f"hosts-relay: delay {delay_ms} ms out of 0..10000", file=sys.stderr)
        return 2
    enter(host_ns)
    a = tap("eth0")  # the host's side
    enter(sw_ns)
    b = tap(port)  # the bridge's side
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    print("READY", flush=True)
    delay = delay_ms / 1e3
    queues = {a: deque(), b: deque()}  # frames to write to that fd: (due, frame)
    other = {a: b, b: a}
    while not stop:
        now = time.monotonic()
        for fd, q in queues.items():
            while q and q[0][0] <= now:
                try:
                    os.write(fd, q.popleft()[1])
                except BlockingIOError:
                    pass  # the device's queue is full: dropped, as a full link drops
                except OSError:
                    pass  # the device is down (its link taken down): dropped
        due = min((q[0][0] for q in queues.values() if q), default=None)
        timeout = None if due is None else max(0.0, due - time.monotonic())
        try:
            ready, _, _ = select.select([a, b], [], [], timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for fd in ready:
            for _ in range(64):
                try:
                    frame = os.read(fd, 65536)
                except (BlockingIOError, OSError):
                    break
                queues[other[fd]].append((now + delay, frame))
    return 0


if __name__ == "__main__":
    sys.exit(main())
