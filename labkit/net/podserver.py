"""The program every pod runs: a TCP/HTTP server and a UDP echo on one port.

    python -S labkit/net/podserver.py --pod a1 --port 8080 --log /run/labkit/demo/pods/a1.log

(``labkit.net.pod_argv``; ``python -m labkit podserver ...`` runs the same code.)

TCP: an HTTP request (``GET /``) is answered with one line naming the pod and
the client address:port the server saw, then the connection closes; any
other bytes are echoed back until the client closes. UDP: each datagram is
answered with ``pod=<name> client=<ip>:<port> data=<payload>``. Every accept
and datagram is logged, so a learner sees what the server saw::

    pod=a1 client=198.18.2.11:43210
"""
from __future__ import annotations

import argparse
import selectors
import socket
import sys
import time

__all__ = ["main", "http_answer"]

_HTTP_METHODS = (b"GET ", b"HEAD ", b"POST ", b"PUT ", b"DELETE ", b"OPTIONS ")


def http_answer(pod: str, client: tuple[str, int]) -> bytes:
    """The HTTP response for a request from ``client``.

    >>> http_answer("a1", ("198.18.2.11", 40000)).split(b"\\r\\n")[-1]
    b'pod=a1 client=198.18.2.11:40000\\n'
    """
    body = f"pod={pod} client={client[0]}:{client[1]}\n".encode()
    head = f"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return head.encode() + body


class _Server:
    def __init__(self, pod: str, port: int, log):
        self.pod = pod
        self.log = log
        self.sel = selectors.DefaultSelector()
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tcp.bind(("0.0.0.0", port))
        self.tcp.listen(512)
        self.tcp.setblocking(False)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("0.0.0.0", port))
        self.udp.setblocking(False)
        self.sel.register(self.tcp, selectors.EVENT_READ, self._accept)
        self.sel.register(self.udp, selectors.EVENT_READ, self._datagram)
        self.peers: dict[socket.socket, tuple[str, int]] = {}

    def _write(self, line: str) -> None:
        self.log.write(f"{time.strftime('%H:%M:%S')} {line}\n")
        self.log.flush()

    def _accept(self, sock) -> None:
        try:
            conn, peer = sock.accept()
        except BlockingIOError:
            return
        conn.setblocking(False)
        self.peers[conn] = peer
        self._write(f"tcp accept pod={self.pod} client={peer[0]}:{peer[1]}")
        self.sel.register(conn, selectors.EVENT_READ, self._read)

    def _close(self, conn) -> None:
        self.sel.unregister(conn)
        self.peers.pop(conn, None)
        conn.close()

    def _read(self, conn) -> None:
        try:
            data = conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not data:
            self._close(conn)
            return
        peer = self.peers[conn]
        try:
            if data.startswith(_HTTP_METHODS):
                self._write(f"http {data.split(b' ', 2)[0].decode()} pod={self.pod} client={peer[0]}:{peer[1]}")
                conn.setblocking(True)
                conn.settimeout(2)
                conn.sendall(http_answer(self.pod, peer))
                self._close(conn)
            else:
                conn.setblocking(True)
                conn.settimeout(2)
                conn.sendall(data)
                conn.setblocking(False)
        except OSError:
            self._close(conn)

    def _datagram(self, sock) -> None:
        try:
            data, peer = sock.recvfrom(65536)
        except BlockingIOError:
            return
        self._write(f"udp pod={self.pod} client={peer[0]}:{peer[1]} bytes={len(data)}")
        reply = f"pod={self.pod} client={peer[0]}:{peer[1]} data=".encode() + data
        try:
            sock.sendto(reply, peer)
        except OSError as exc:
            self._write(f"udp reply failed: {exc}")

    def serve(self) -> None:
        self._write(f"listening pod={self.pod} tcp+udp port={self.tcp.getsockname()[1]}")
        while True:
            for key, _ in self.sel.select():
                key.data(key.fileobj)


def main(argv: list[str] | None = None) -> None:
    """Run the pod server until killed."""
    ap = argparse.ArgumentParser(prog="labkit.net.podserver", description=__doc__.splitlines()[0])
    ap.add_argument("--pod", required=True)
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--log", required=True)
    args = ap.parse_args(argv)
    with open(args.log, "a", buffering=1) as log:
        try:
            _Server(args.pod, args.port, log).serve()
        except KeyboardInterrupt:
            sys.exit(0)


if __name__ == "__main__":  # run as a file (labkit.net.pod_argv), without site
    main()
