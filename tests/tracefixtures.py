"""Fabricated trace records for the tests of the trace reader, the path view and steps (no lab, no kernel).

    t = tup("198.18.1.11", 40000, "198.18.2.11", 8080, 6, 0x02)    # a TCP SYN's tuple, fields in network order
    ev = syn_event(hook=4, node_id=2, before=t, after=t)           # node-a's SYN at from-container, fields replaced
"""
from __future__ import annotations

from labkit.addr import be32
from labkit.observe.trace import TraceEvent, TraceTuple

__all__ = ["be16", "tup", "syn_event", "recorded_steps", "event", "ping_flows", "ECHO", "OUTER", "CT_NONE"]



def recorded_event(hex_text: str) -> TraceEvent:
    """A record of tcp_conn_trace.json. It was recorded when struct trace_event was 96 bytes; the 8 bytes the
    record has grown since (a policy verdict's remote identity and padding) were zero in every such record."""
    from labkit.observe.trace import EVENT_SIZE

    raw = bytes.fromhex(hex_text)
    return TraceEvent.from_buffer_copy(raw + bytes(EVENT_SIZE - len(raw)))

def be16(port: int) -> int:
    return int.from_bytes(port.to_bytes(2, "big"), "little")


def tup(src, sport, dst, dport, proto=6, tcp_flags=0, icmp_type=0) -> TraceTuple:
    return TraceTuple(be32(src), be32(dst), be16(sport), be16(dport), proto, tcp_flags, icmp_type, 0)


def syn_event(**over) -> TraceEvent:
    """TCP SYN 198.18.1.11:40000 -> 198.18.2.11:8080 at node-a's from-container, CT new/egress, tunnelled."""
    t = tup("198.18.1.11", 40000, "198.18.2.11", 8080, 6, 0x02)
    ev = TraceEvent(
        ts_ns=123,
        ifindex=5,
        len=74,
        node_id=1,
        hook=1,  # HOOK_FROM_CONTAINER
        verdict=1,  # VERDICT_FORWARDED
        ct_result=0,  # CT_NEW
        drop_reason=0,
        ct_flags=0,
        ct_lifetime=160,
        ct_dir=0,  # CT_EGRESS
        ct_tx_seen=0x02,
        ct_rx_seen=0,
        tunnel_endpoint=be32("198.51.100.12"),
        identity=256,
        before=t,
        after=t,
    )
    for k, v in over.items():
        setattr(ev, k, v)
    return ev


def recorded_steps(name: str, path=None) -> list:
    """The steps of connection ``name`` ("a1-b1", "a1-web") recorded by tests/record_trace.py on the real
    datapath, rebuilt as Step objects (records and CT rows as recorded) on a lab stand-in."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from labkit.config import DatapathConfig
    from labkit.maps.ct import CtRow
    from labkit.net.topology import Topology
    from labkit.notebook.steps import Step
    from labkit.observe.trace import Flow

    path = Path(path or Path(__file__).parent / "unit" / "data" / "tcp_conn_trace.json")
    data = json.loads(path.read_text())

    def row(d: dict) -> CtRow:
        return CtRow(**{**d, "key": bytes.fromhex(d["key"])})

    out = []
    for s in data["connections"][name]:
        lab = SimpleNamespace(name="demo", topology=Topology.default("demo"),
                              config=DatapathConfig().with_options(routing=data["routing"]),
                              clock=SimpleNamespace(now=lambda now=s["now"]: now),
                              ct_command=lambda node: [f"cilium-dbg bpf ct list global  # {node}"])
        flows = [Flow(recorded_event(f["event"]), f["node"], f["device"])
                 for f in s["flows"]]
        out.append(Step(s["title"], lab, flows, {n: [row(r) for r in rows] for n, rows in s["before"].items()},
                        {n: [row(r) for r in rows] for n, rows in s["after"].items()}, s["result"], s["now"]))
    return out


CT_NONE = 0xFF


def event(ts, node_id, hook, verdict, before, after=None, inner=None, ct_result=CT_NONE, ct_dir=CT_NONE,
          tunnel=None, drop=0, ct_flags=0) -> TraceEvent:
    """A trace record with the fields the path views read (the rest zero)."""
    ev = TraceEvent(ts_ns=ts, node_id=node_id, hook=hook, verdict=verdict, ct_result=ct_result, ct_dir=ct_dir,
                    ct_flags=ct_flags, drop_reason=drop, tunnel_endpoint=be32(tunnel) if tunnel else 0,
                    before=before, after=after if after is not None else before)
    if inner is not None:
        ev.inner = inner
    return ev


ECHO = tup("198.18.1.11", 0x1234, "198.18.2.11", 0, 1, 0, 8)  # a1 -> b1 ICMP EchoRequest
OUTER = tup("198.51.100.11", 40001, "198.51.100.12", 8472, 17)  # node-a -> node-b VXLAN


def ping_flows() -> list:
    """a1 -> b1 ping in tunnel mode, one record per hook, in time order."""
    from labkit.observe.trace import Flow

    return [
        Flow(event(100, 1, 1, 2, ECHO, ct_result=0, ct_dir=0, tunnel="198.51.100.12"), "node-a", "lxc-a1"),
        Flow(event(200, 1, 6, 1, ECHO, tunnel="198.51.100.12"), "node-a", "cilium_vxlan"),
        Flow(event(300, 1, 4, 1, OUTER, inner=ECHO), "node-a", "eth0"),
        Flow(event(400, 2, 3, 1, OUTER, inner=ECHO), "node-b", "eth0"),
        Flow(event(500, 2, 5, 1, ECHO), "node-b", "cilium_vxlan"),
        Flow(event(600, 2, 2, 1, ECHO, ct_result=0, ct_dir=1), "node-b", "lxc-b1"),
    ]
