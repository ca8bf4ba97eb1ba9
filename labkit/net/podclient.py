"""A client that lives in a pod and opens, feeds and closes connections on
command, so a notebook can advance TCP one step at a time.

    python -S labkit/net/podclient.py  # started by labkit in the pod's netns and cgroup (labkit.net.pod_argv)

It reads one JSON command per line on stdin and answers one JSON line:

=============================================  ==========================================
``{"op": "tcp_open", "id": 1, "host", "port"}``  connect; answers ``sport`` or ``error``
``{"op": "tcp_send", "id": 1, "data": hex}``     send, read the echo back
``{"op": "tcp_close", "id": 1}``                 FIN (shutdown), read to EOF, close
``{"op": "tcp_reset", "id": 1}``                 close with SO_LINGER 0: the kernel sends RST
``{"op": "udp", "host", "port", "data": hex}``   one datagram, wait for the answer
``{"op": "raw", "packet": hex}``                 send an IPv4 packet as given (IP_HDRINCL)
=============================================  ==========================================

After reading data it sets TCP_QUICKACK so the ACK leaves at once: every
step ends with a known last packet instead of a delayed ACK.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import socket
import struct
import sys

__all__ = ["main"]

TIMEOUT = 3.0


def _kernel_peer(sport: int) -> str | None:
    """The remote address the kernel really uses for our TCP socket on ``sport`` (from /proc/net/tcp),
    which socket LB's getpeername hook would otherwise hide."""
    try:
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                local, remote = line.split()[1:3]
                if int(local.split(":")[1], 16) == sport:
                    ip_hex, port_hex = remote.split(":")
                    ip = socket.inet_ntoa(struct.pack("<I", int(ip_hex, 16)))
                    return f"{ip}:{int(port_hex, 16)}"
    except OSError:
        return None
    return None


def _error(exc: OSError) -> dict:
    name = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return {"ok": False, "error": name, "message": str(exc)}


class _Client:
    def __init__(self):
        self.socks: dict[int, socket.socket] = {}

    def tcp_open(self, cmd: dict) -> dict:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(cmd.get("timeout", TIMEOUT))
        if cmd.get("sport"):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", cmd["sport"]))
        try:
            s.connect((cmd["host"], cmd["port"]))
        except OSError as exc:
            sport = s.getsockname()[1]
            s.close()
            return {**_error(exc), "sport": sport}
        self.socks[cmd["id"]] = s
        peer = s.getpeername()
        sport = s.getsockname()[1]
        return {"ok": True, "sport": sport, "peer": f"{peer[0]}:{peer[1]}", "real_peer": _kernel_peer(sport)}

    def tcp_send(self, cmd: dict) -> dict:
        s = self.socks[cmd["id"]]
        data = bytes.fromhex(cmd["data"])
        try:
            s.sendall(data)
            got = b""
            while len(got) < len(data):
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        except OSError as exc:
            return _error(exc)
        return {"ok": True, "reply": got.hex()}

    def tcp_close(self, cmd: dict) -> dict:
        s = self.socks.pop(cmd["id"])
        try:
            # Has the peer closed first (e.g. after answering an HTTP request)? Ask without
            # waiting: a socket with a timeout would poll for that long despite MSG_DONTWAIT.
            timeout = s.gettimeout()
            s.setblocking(False)
            try:
                peer_closed = s.recv(1, socket.MSG_PEEK) == b""
            except BlockingIOError:
                peer_closed = False
            finally:
                s.settimeout(timeout)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        except OSError as exc:
            s.close()
            return _error(exc)
        s.close()
        return {"ok": True, "peer_closed_first": peer_closed}

    def tcp_reset(self, cmd: dict) -> dict:
        s = self.socks.pop(cmd["id"])
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        return {"ok": True}

    def udp(self, cmd: dict) -> dict:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(cmd.get("timeout", TIMEOUT))
        try:
            if cmd.get("sport"):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("0.0.0.0", cmd["sport"]))
            s.connect((cmd["host"], cmd["port"]))  # connected, so an ICMP port unreachable ends the wait
            s.send(bytes.fromhex(cmd["data"]))
            sport = s.getsockname()[1]
            reply, peer = s.recvfrom(65536)
        except OSError as exc:
            return {**_error(exc), "sport": s.getsockname()[1]}
        finally:
            s.close()
        return {"ok": True, "sport": sport, "reply": reply.hex(), "peer": f"{peer[0]}:{peer[1]}"}

    def raw(self, cmd: dict) -> dict:
        packet = bytes.fromhex(cmd["packet"])
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        try:
            s.sendto(packet, (socket.inet_ntoa(packet[16:20]), 0))
        except OSError as exc:
            return _error(exc)
        finally:
            s.close()
        return {"ok": True}


def main(argv: list[str] | None = None) -> None:
    """Serve commands until stdin closes."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: go when the notebook kernel goes
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a kernel interrupt is for the kernel, not for us
    client = _Client()
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            answer = getattr(client, cmd["op"])(cmd)
        except OSError as exc:
            answer = _error(exc)
        except Exception as exc:  # report, keep serving
            answer = {"ok": False, "error": type(exc).__name__, "message": str(exc)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":  # run as a file (labkit.net.pod_argv), without site
    main()
