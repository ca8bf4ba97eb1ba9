"""The client end of labkitd's socket, against a small server on a temporary socket (no root needed)."""
from __future__ import annotations

import os
import socket
import struct
import threading

import pytest

from labkit.client.door import DoorClient
from labkit.door.server import read_frame, send_frame
from labkit.errors import DoorDownError


def _peer_pid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[0]


@pytest.fixture
def server(tmp_path):
    """A server that answers every request with the pid of the process that opened the connection it came on."""
    path = str(tmp_path / "door.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)

    def serve(conn: socket.socket) -> None:
        with conn:
            pid = _peer_pid(conn)
            while (got := read_frame(conn)) is not None:
                send_frame(conn, {"ok": True, "value": pid})

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield path
    listener.close()


def test_a_forked_child_opens_a_connection_of_its_own(server):
    """A child forked after its parent's first call sends its requests on a connection it opened, so parent and
    child never read each other's answers; the parent's connection still works after the child closed its copy."""
    client = DoorClient(server)
    assert client.call("hello") == os.getpid()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            ok = client.call("hello") == os.getpid()
        except BaseException:
            ok = False
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(child, 0)
    os.close(read)
    assert answer == b"1"
    assert client.call("hello") == os.getpid()


def test_each_thread_keeps_its_own_connection(server):
    """Two threads of one process each get answers on connections of their own, and both are this process's."""
    client = DoorClient(server)
    got = []
    threads = [threading.Thread(target=lambda: got.append(client.call("hello"))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [os.getpid(), os.getpid()]


def test_no_server_is_one_line_saying_how_to_start_it(tmp_path):
    """A socket nobody listens on is a DoorDownError naming the path and how to start labkitd."""
    with pytest.raises(DoorDownError, match=r"no labkitd answers on .*labkit daemon start"):
        DoorClient(tmp_path / "none.sock").call("hello")
