"""Lab 12's graders (labkit/grading/exercises/lab12.py) on recorded steps built by hand: how answers are read
(TCP flag combinations, drop reasons in Hubble's words, names or numbers) and what the sockmap graders make of a
connection whose send did or did not cross the veth hooks. The notebook itself runs in tests/labs."""
from __future__ import annotations

import socket
from types import SimpleNamespace

from labkit.constants import DropReason, Hook
from labkit.grading.checks import registry
from labkit.grading.exercises.lab12 import _flag_set, _flag_text, _reason
from labkit.maps.ct import TcpFlags

A1, A2 = "198.18.1.11", "198.18.1.12"
SPORT = 40000


def test_flag_combinations_read_in_any_order_and_spelling():
    """'ack|syn', 'SYN+ACK' and 'syn ack' are one combination, printed as the trace prints it; a word that is not a
    TCP flag makes the item unreadable."""
    assert _flag_set("ack|syn") == _flag_set("SYN+ACK") == _flag_set("syn ack") == frozenset({"SYN", "ACK"})
    assert _flag_text(_flag_set("ack|fin")) == TcpFlags.text(TcpFlags.FIN | TcpFlags.ACK) == "FIN|ACK"
    assert _flag_set("SYN|DATA") is None and _flag_set("") is None


def test_drop_reasons_read_from_text_name_or_number():
    """A drop reason is accepted as Hubble's text (any case), as DROP_NAME or NAME, or as its number."""
    want = DropReason.NO_SERVICE
    assert _reason("service backend not found") is want
    assert _reason("DROP_NO_SERVICE") is want and _reason("no-service") is want and _reason(-158) is want
    assert _reason("IP fragmentation not supported") is DropReason.FRAG_NOSUPPORT
    assert _reason("no such reason") is None and _reason(-1) is None


def _tuple(src: str, sport: int, dst: str, dport: int, flags: int):
    return SimpleNamespace(saddr=int.from_bytes(socket.inet_aton(src), "little"), sport=socket.htons(sport),
                           daddr=int.from_bytes(socket.inet_aton(dst), "little"), dport=socket.htons(dport),
                           proto=socket.IPPROTO_TCP, tcp_flags=flags)


def _flow(hook: Hook, flags: int, reply: bool = False):
    t = _tuple(A2, 8080, A1, SPORT, flags) if reply else _tuple(A1, SPORT, A2, 8080, flags)
    return SimpleNamespace(node="node-a", hook=hook, event=SimpleNamespace(before=t), dropped=False)


def _row(packets: int):
    return SimpleNamespace(proto_name="TCP", dir="OUT", related=False, sport=SPORT, dport=8080, packets=packets)


def _step(op: str, flows: list, packets: int, target: str = "a2", sport: int = SPORT):
    row = SimpleNamespace(**{**vars(_row(packets)), "sport": sport})
    return SimpleNamespace(title=f"a1 → {target}:8080 TCP {op}", ok=True, flows=flows, after={"node-a": [row]},
                           attrs={"op": f"tcp-{op}", "actor": "a1", "target": target, "port": 8080, "conn": target,
                                  "sport": sport, "faults": ()})


class _Evidence:
    """What a grader reads: recorded steps, matched by their attributes (labkit.observe.evidence.Evidence)."""

    def __init__(self, steps):
        self._steps = steps

    def steps(self, **attrs):
        return [s for s in self._steps if all(s.attrs.get(k) == v for k, v in attrs.items())]

    def step(self, **attrs):
        found = self.steps(**attrs)
        return found[-1] if found else None


def _handshake():
    syn, synack, ack = TcpFlags.SYN, TcpFlags.SYN | TcpFlags.ACK, TcpFlags.ACK
    return [_flow(h, f, reply=(f == synack)) for f in (syn, synack, ack) for h in (Hook.FROM_CONTAINER, Hook.TO_CONTAINER)]


def _teardown():
    fin = TcpFlags.FIN | TcpFlags.ACK
    return [_flow(h, fin, reply=r) for r in (False, True) for h in (Hook.FROM_CONTAINER, Hook.TO_CONTAINER)] + \
        [_flow(h, TcpFlags.ACK) for h in (Hook.FROM_CONTAINER, Hook.TO_CONTAINER)]


def _same_node(redirected: bool, far_counted: bool = True):
    data = [] if redirected else [_flow(Hook.FROM_CONTAINER, TcpFlags.PSH | TcpFlags.ACK),
                                  _flow(Hook.TO_CONTAINER, TcpFlags.PSH | TcpFlags.ACK)]
    steps = [_step("open", _handshake(), 3), _step("send", data, 3 if redirected else 6), _step("close", _teardown(), 6)]
    far = [_step("open", [], 3, "b1", 41000), _step("send", [], 7 if far_counted else 3, "b1", 41000)]
    return _Evidence(steps + far)


def test_veth_flags_of_a_redirected_connection():
    """12.1 passes the handshake and teardown combinations when the send crossed no hook, and the same answer fails
    once a data segment (PSH|ACK) crossed them: the grader reads the recorded flows, not the answer key."""
    grade = registry()["12.1"].grade
    answer = ["SYN", "SYN|ACK", "ACK", "FIN|ACK"]
    assert grade(answer, _same_node(redirected=True)).passed
    assert not grade(answer, _same_node(redirected=False)).passed
    assert "PSH" in grade(answer + ["PSH|ACK"], _same_node(redirected=True)).message


def test_ct_packets_after_open_and_send():
    """12.2 passes (3, 3) when the send left the OUT row where the handshake put it, fails it when the send was
    counted, and asks for the cells again (no try) when the cross-node send was not counted either (accounting
    off)."""
    grade = registry()["12.2"].grade
    assert grade((3, 3), _same_node(redirected=True)).passed
    assert not grade((3, 3), _same_node(redirected=False)).passed
    off = grade((3, 3), _same_node(redirected=True, far_counted=False))
    assert not off.passed and off.missing == "2. What conntrack counted"
