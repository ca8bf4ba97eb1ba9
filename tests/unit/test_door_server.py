"""labkit.door.server: frames and their descriptors over a unix socket, and the Door that answers them (a handler of
the test's own, no labkitd verbs, no root)."""
from __future__ import annotations

import array
import json
import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from labkit.door import api, server
from labkit.door.owners import Caller
from labkit.door.server import Door, _PerUser, read_frame, send_frame
from labkit.errors import LimitError, RequestError

ALICE = Caller(uid=1000, gid=1000, pid=4242, name="alice", groups=frozenset())


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def pipes():
    """Pipes (read end, write end) the test opens; closed after it."""
    made: list[int] = []

    def make():
        r, w = os.pipe()
        made.extend((r, w))
        return r, w

    yield make
    for fd in made:
        try:
            os.close(fd)
        except OSError:
            pass


# -- frames ------------------------------------------------------------------------------------
def test_a_frame_comes_back_as_it_was_sent(pair):
    """send_frame then read_frame gives the object's JSON body and no descriptors."""
    a, b = pair
    obj = {"verb": "ct", "lab": "demo", "args": {"node": "node-a", "ü": [1, 2.5, None]}}
    send_frame(a, obj)
    body, fds = read_frame(b)
    assert json.loads(body) == obj and body == api.encode(obj) and fds == []


def test_frames_follow_one_another_and_end_cleanly(pair):
    """Two frames read in order; EOF at a frame boundary is None, not an error."""
    a, b = pair
    send_frame(a, {"n": 1})
    send_frame(a, {"n": 2})
    a.shutdown(socket.SHUT_WR)
    assert json.loads(read_frame(b)[0]) == {"n": 1}
    assert json.loads(read_frame(b)[0]) == {"n": 2}
    assert read_frame(b) is None


def test_descriptors_sent_with_a_frame_arrive_and_work(pair, pipes):
    """Two pipe ends sent with a frame arrive as descriptors of the same pipes: written and read through."""
    a, b = pair
    r1, w1 = pipes()
    r2, w2 = pipes()
    send_frame(a, {"verb": "exec"}, fds=[w1, r2])
    body, fds = read_frame(b)
    assert json.loads(body) == {"verb": "exec"} and len(fds) == 2 and not {w1, r2} & set(fds)
    try:
        os.write(fds[0], b"to the caller's pipe")
        assert os.read(r1, 100) == b"to the caller's pipe"
        os.write(w2, b"from the caller")
        assert os.read(fds[1], 100) == b"from the caller"
    finally:
        for fd in fds:
            os.close(fd)


def test_more_descriptors_than_allowed_are_refused_and_none_kept(pair, pipes):
    """Five descriptors against four allowed: RequestError (MSG_CTRUNC), and not one received descriptor stays open."""
    a, b = pair
    ends = [fd for _ in range(3) for fd in pipes()]
    before = _open_fds()
    send_frame(a, {"verb": "exec"}, fds=ends[:5])
    with pytest.raises(RequestError, match="carried more than 4 file descriptors"):
        read_frame(b, max_fds=4)
    assert _open_fds() == before


def test_a_frame_larger_than_the_limit_is_refused_before_its_body_is_read(pair, pipes):
    """A header announcing more than the limit is refused at once: the body stays unread, its descriptor closed."""
    a, b = pair
    _, w = pipes()
    before = _open_fds()
    a.sendmsg([api.HEADER.pack(100)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [w]))])
    a.sendall(b"x" * 100)
    with pytest.raises(RequestError) as exc:
        read_frame(b, limit=10)
    assert str(exc.value) == "request: 100 bytes; labkitd reads at most 10 bytes per request"
    assert _open_fds() == before
    b.setblocking(False)
    assert b.recv(1000) == b"x" * 100


def test_a_connection_closed_inside_a_frame_is_an_error(pair):
    """A body cut short, or a header cut short, is a RequestError saying where the connection ended."""
    a, b = pair
    a.sendall(api.HEADER.pack(10) + b"abc")
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(RequestError, match="the connection ended after 3 of 10 bytes"):
        read_frame(b)
    c, d = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with c, d:
        c.sendall(b"\x00\x00")
        c.shutdown(socket.SHUT_WR)
        with pytest.raises(RequestError, match="inside a frame's header"):
            read_frame(d)


def test_a_stalled_frame_times_out_and_the_socket_blocks_again(pair, monkeypatch):
    """A body that does not come within FRAME_TIMEOUT is a RequestError; the socket is left blocking."""
    monkeypatch.setattr(server, "FRAME_TIMEOUT", 0.2)
    a, b = pair
    a.sendall(api.HEADER.pack(10) + b"abc")
    with pytest.raises(RequestError, match="did not come within 0.2 s"):
        read_frame(b)
    assert b.gettimeout() is None


# -- per user ----------------------------------------------------------------------------------
def test_per_user_counts_refuse_past_the_limit_and_give_back():
    """A uid at its limit is refused with the refusal filled in; giving one back allows the next; uids count apart."""
    per = _PerUser()
    refusal = "request refused: you have {n} requests in progress; labkitd allows {limit}"
    per.take("req", 1000, 2, refusal)
    per.take("req", 1000, 2, refusal)
    with pytest.raises(LimitError) as exc:
        per.take("req", 1000, 2, refusal)
    assert str(exc.value) == "request refused: you have 2 requests in progress; labkitd allows 2"
    per.take("req", 1001, 2, refusal)  # another user
    per.take("conn", 1000, 2, refusal)  # another count
    per.give("req", 1000)
    per.take("req", 1000, 2, refusal)


def test_root_is_not_held_to_the_per_user_limits():
    """uid 0 is never refused by _PerUser, whatever its count."""
    per = _PerUser()
    for _ in range(5):
        per.take("req", 0, 1, "refused")


def test_giving_back_more_than_taken_does_not_go_negative():
    """A count given back below zero is simply gone: the next take starts from zero again."""
    per = _PerUser()
    per.give("req", 1000)
    per.take("req", 1000, 1, "refused {n}")
    with pytest.raises(LimitError, match="refused 1"):
        per.take("req", 1000, 1, "refused {n}")


# -- the Door ----------------------------------------------------------------------------------
@pytest.fixture
def short_dir():
    """A directory with a short path (a unix socket's path has at most 107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="lkd"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _limits(**over):
    return SimpleNamespace(**{"concurrent_per_user": 8, "connections_per_user": 64, **over})


class _Serving:
    """A Door serving on a thread, shut down and closed at the end."""

    def __init__(self, path, handle, limits=None):
        self.lines: list[str] = []
        self.door = Door(path, handle, limits or _limits(), log=self.lines.append)
        self.thread = threading.Thread(target=self.door.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.door.shutdown()
        self.door.server_close()
        self.thread.join(5)


@pytest.fixture
def serve():
    running: list[_Serving] = []

    def start(path, handle, limits=None):
        s = _Serving(path, handle, limits)
        running.append(s)
        return s

    yield start
    for s in running:
        s.close()


def _connect(path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(path))
    return s


def _ask(sock, obj, fds=None):
    send_frame(sock, obj, fds)
    got = read_frame(sock)
    return None if got is None else json.loads(got[0])


def _echo(caller, body, fds):
    return api.answer({"uid": caller.uid, "pid": caller.pid, "request": json.loads(body), "fds": len(fds)})


def test_a_request_gets_the_handlers_answer(short_dir, serve):
    """The Door reads a request, hands it to the handler with the kernel's caller, and answers with its frame."""
    path = short_dir / "labkitd.sock"
    serve(path, _echo)
    assert os.stat(path).st_mode & 0o777 == 0o666
    with _connect(path) as s:
        first = _ask(s, {"verb": "hello"})
        second = _ask(s, {"verb": "again"})  # one connection carries requests one after another
    assert first == {"ok": True, "value": {"uid": os.getuid(), "pid": os.getpid(), "request": {"verb": "hello"},
                                            "fds": 0}}
    assert second["value"]["request"] == {"verb": "again"}


def test_descriptors_reach_the_handler_and_are_closed_after_the_answer(short_dir, serve, pipes):
    """The handler writes to the descriptor the request carried; once answered, the Door has closed its copy."""
    path = short_dir / "labkitd.sock"

    def handle(caller, body, fds):
        os.write(fds[0], b"written by the door")
        return api.answer(len(fds))

    serve(path, handle)
    r, w = pipes()
    with _connect(path) as s:
        assert _ask(s, {"verb": "x"}, fds=[w]) == {"ok": True, "value": 1}
        os.close(w)
        assert os.read(r, 100) == b"written by the door"
        assert os.read(r, 100) == b""  # every write end closed: the Door kept none


def test_a_request_too_large_is_answered_and_ends_the_connection(short_dir, serve):
    """A header announcing more than MAX_REQUEST is answered with RequestError, and the connection ends."""
    path = short_dir / "labkitd.sock"
    serve(path, _echo)
    with _connect(path) as s:
        s.sendall(api.HEADER.pack(api.MAX_REQUEST + 1))
        body, _ = read_frame(s)
        assert json.loads(body)["error"]["type"] == "RequestError"
        assert "labkitd reads at most" in json.loads(body)["error"]["message"]
        assert read_frame(s) is None


def test_a_second_door_on_the_same_path_is_refused(short_dir, serve):
    """While one Door answers on a path, another is refused (LimitError) and the first goes on answering."""
    path = short_dir / "labkitd.sock"
    serve(path, _echo)
    with pytest.raises(LimitError, match="another labkitd is answering there"):
        Door(path, _echo, _limits())
    with _connect(path) as s:
        assert _ask(s, {"verb": "still"})["ok"]


def test_a_stale_socket_file_is_replaced(short_dir, serve):
    """A socket file no one listens on (a labkitd killed) is removed, and the new Door serves there."""
    path = short_dir / "labkitd.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()
    assert path.is_socket()
    serve(path, _echo)
    with _connect(path) as s:
        assert _ask(s, {"verb": "hello"})["ok"]


def test_a_file_that_is_not_a_socket_is_not_removed(short_dir):
    """A regular file at the socket's path is refused (RequestError) and left as it was."""
    path = short_dir / "labkitd.sock"
    path.write_text("mine")
    with pytest.raises(RequestError, match="not a socket is in the way"):
        Door(path, _echo, _limits())
    assert path.read_text() == "mine"


def test_closing_the_door_removes_its_socket(short_dir):
    """server_close() removes the socket file."""
    path = short_dir / "labkitd.sock"
    door = Door(path, _echo, _limits())
    door.server_close()
    assert not path.exists()


@pytest.fixture
def as_alice(monkeypatch):
    """Every connection's caller is alice (uid 1000): root's own connections are not held to per-user limits."""
    monkeypatch.setattr(Caller, "of_socket", classmethod(lambda cls, sock: ALICE))


def test_a_second_concurrent_request_of_a_user_is_refused(short_dir, serve, as_alice):
    """With one request in progress allowed, a user's second at once is answered with the LimitError line; once
    the first is answered the next one is served."""
    path = short_dir / "labkitd.sock"
    entered, release = threading.Event(), threading.Event()

    def handle(caller, body, fds):
        if json.loads(body)["verb"] == "slow":
            entered.set()
            release.wait(10)
        return api.answer(json.loads(body)["verb"])

    serve(path, handle, _limits(concurrent_per_user=1))
    first = _connect(path)
    answers = {}
    t = threading.Thread(target=lambda: answers.setdefault("slow", _ask(first, {"verb": "slow"})))
    t.start()
    try:
        assert entered.wait(10)
        with _connect(path) as second:
            refused = _ask(second, {"verb": "fast"})
            assert refused == {"ok": False, "error": {
                "type": "LimitError", "errno": None,
                "message": "request refused: you have 1 requests in progress; labkitd allows 1"}}
            release.set()
            t.join(10)
            assert answers["slow"] == {"ok": True, "value": "slow"}
            assert _ask(second, {"verb": "fast"}) == {"ok": True, "value": "fast"}  # the same connection goes on
    finally:
        release.set()
        first.close()


def test_a_connection_past_the_users_limit_is_refused(short_dir, serve, as_alice):
    """With one connection allowed, a user's second is answered with the LimitError line and closed."""
    path = short_dir / "labkitd.sock"
    serve(path, _echo, _limits(connections_per_user=1))
    with _connect(path) as first:
        assert _ask(first, {"verb": "hello"})["ok"]
        with _connect(path) as second:
            body, _ = read_frame(second)
            assert json.loads(body)["error"] == {
                "type": "LimitError", "errno": None,
                "message": "connection refused: you have 1 connections open to labkitd; it allows 1"}
            assert read_frame(second) is None
