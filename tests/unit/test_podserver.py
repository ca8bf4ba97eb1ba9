"""The pod server: HTTP answer, TCP echo, UDP reply and its log, run as a real process on loopback."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from labkit.net import pod_argv
from labkit.net.podserver import http_answer


def test_http_answer_format():
    """http_answer is an HTTP/1.0 200 with text/plain, exact Content-Length, Connection: close and one body line."""
    raw = http_answer("a1", ("198.18.2.11", 40000))
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.0 200 OK"
    headers = dict(line.split(b": ", 1) for line in lines[1:])
    assert headers[b"Content-Type"] == b"text/plain"
    assert headers[b"Connection"] == b"close"
    assert body == b"pod=a1 client=198.18.2.11:40000\n"
    assert int(headers[b"Content-Length"]) == len(body)


def test_pod_programs_run_from_their_file_without_site():
    """pod_argv runs podserver and podclient as files under ``python -S``: they import only the standard library
    (no labkit on the path, no site-packages) and start (here: --help, and a client at end of input)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(pod_argv("podserver", "--help"), env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "--pod" in out.stdout, out.stderr
    client = subprocess.run(pod_argv("podclient"), env=env, input="", capture_output=True, text=True, timeout=30)
    assert client.returncode == 0, client.stderr
    with pytest.raises(ValueError, match="expected one of podserver, podclient"):
        pod_argv("loader")


def _free_port() -> int:
    """A port free for both TCP and UDP on all addresses right now."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
            t.bind(("0.0.0.0", 0))
            port = t.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                try:
                    u.bind(("0.0.0.0", port))
                except OSError:
                    continue
            return port
    pytest.fail("no free TCP+UDP port")


@pytest.fixture
def server(tmp_path):
    """A pod server 'x' in a subprocess; yields (port, log path) once it listens."""
    port = _free_port()
    log = tmp_path / "x.log"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the pod's command line needs no labkit on the path
    proc = subprocess.Popen(
        pod_argv("podserver", "--pod", "x", "--port", str(port), "--log", str(log)),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 15
        while not (log.exists() and "listening" in log.read_text()):
            if proc.poll() is not None:
                pytest.fail(f"pod server exited: {proc.stderr.read().decode()}")
            if time.monotonic() > deadline:
                pytest.fail("pod server did not start listening")
            time.sleep(0.02)
        yield port, log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def _recv_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _wait_log(log: Path, pattern: str) -> str:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        text = log.read_text()
        if re.search(pattern, text, re.M):
            return text
        time.sleep(0.02)
    pytest.fail(f"{pattern!r} not in log:\n{log.read_text()}")


def test_listening_line(server):
    """The log starts with the listening line naming pod and port."""
    port, log = server
    assert re.search(rf"^\d\d:\d\d:\d\d listening pod=x tcp\+udp port={port}$", log.read_text(), re.M)


def test_http_get(server):
    """An HTTP GET is answered with pod=x client=127.0.0.1:<our port>, then the server closes; both are logged."""
    port, log = server
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        cport = s.getsockname()[1]
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        reply = _recv_all(s)
    assert reply.startswith(b"HTTP/1.0 200 OK\r\n")
    assert reply.split(b"\r\n\r\n", 1)[1] == f"pod=x client=127.0.0.1:{cport}\n".encode()
    text = _wait_log(log, rf"http GET pod=x client=127\.0\.0\.1:{cport}$")
    assert re.search(rf"^\d\d:\d\d:\d\d tcp accept pod=x client=127\.0\.0\.1:{cport}$", text, re.M)


def test_tcp_echo(server):
    """Non-HTTP bytes are echoed back on the same connection until the client closes."""
    port, log = server
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        cport = s.getsockname()[1]
        for msg in (b"hello\n", b"\x00\x01binary", b"again"):
            s.sendall(msg)
            got = b""
            while len(got) < len(msg):
                got += s.recv(65536)
            assert got == msg
        s.shutdown(socket.SHUT_WR)
        assert _recv_all(s) == b""
    _wait_log(log, rf"tcp accept pod=x client=127\.0\.0\.1:{cport}$")


def test_udp_reply(server):
    """A datagram gets 'pod=x client=127.0.0.1:<port> data=<payload>' back and a log line with its size."""
    port, log = server
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.settimeout(5)
        u.bind(("127.0.0.1", 0))
        cport = u.getsockname()[1]
        u.sendto(b"hello", ("127.0.0.1", port))
        data, peer = u.recvfrom(65536)
    assert data == f"pod=x client=127.0.0.1:{cport} data=hello".encode()
    assert peer == ("127.0.0.1", port)
    _wait_log(log, rf"^\d\d:\d\d:\d\d udp pod=x client=127\.0\.0\.1:{cport} bytes=5$")


def test_serves_several_clients(server):
    """Two connections open at once are both served (the server does not block on one)."""
    port, _ = server
    with socket.create_connection(("127.0.0.1", port), timeout=5) as idle, \
            socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        idle.sendall(b"x")
        assert idle.recv(10) == b"x"
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert b"pod=x client=127.0.0.1:" in _recv_all(s)
