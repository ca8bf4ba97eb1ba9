"""Helpers for datapath tests: wait for a condition, drive a TCP client in a pod."""
from __future__ import annotations

import subprocess
import sys
import time

_CLIENT = r"""
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
s = socket.create_connection((host, port), timeout=5)
print("connected", s.getsockname()[1], flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "send":
        s.sendall(b"hello labkit")
        print("echo", s.recv(100).decode(), flush=True)
    elif cmd == "close":
        s.shutdown(socket.SHUT_WR)
        print("eof", s.recv(100) == b"", flush=True)
        s.close()
        print("closed", flush=True)
        break
"""


def wait_for(predicate, timeout: float = 3.0, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


class TcpClient:
    """A TCP connection from a pod, advanced one step at a time."""

    def __init__(self, lab, pod: str, host: str, port: int = 8080):
        self.proc = lab.popen(pod, [sys.executable, "-c", _CLIENT, host, str(port)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().split()
        assert line and line[0] == "connected", f"client in {pod} did not connect: {line}"
        self.port = int(line[1])

    def send(self) -> str:
        self.proc.stdin.write("send\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        self.proc.stdin.write("close\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "eof True"
        assert self.proc.stdout.readline().strip() == "closed"
        self.proc.wait(5)


def rows(lab, node: str, proto: str | None = None, direction: str | None = None, related: bool | None = None):
    """CT rows of ``node`` filtered by protocol name, OUT/IN/SVC and relatedness."""
    out = []
    for r in lab.ct(node):
        if proto and r.proto_name != proto:
            continue
        if direction and r.dir != direction:
            continue
        if related is not None and r.related != related:
            continue
        out.append(r)
    return out
