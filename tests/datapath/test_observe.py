"""Hubble-shaped observation on the real datapath: which trace records Cilium's monitor aggregation
would have reported, the Hubble ring the monitor keeps, lost events, and ``labkit observe``.

The rules the expected numbers come from (Cilium v1.16):
- bpf/lib/trace.h ``emit_trace_notify``: from TRACE_AGGREGATE_RX (level lowest=1, low=2) on no
  from-* observation point is sent; from TRACE_AGGREGATE_ACTIVE_CT (medium=3, maximum=4) on only
  notifications whose ``monitor`` argument is non-zero;
- bpf/lib/conntrack.h ``__ct_lookup``: ``monitor`` is non-zero on a miss (a new flow), on every FIN
  or RST (ACTION_CLOSE), and when ``__ct_update_timeout`` reports: the direction's seen TCP flags
  changed or CT_REPORT_INTERVAL (5 s) passed; on an entry already closed both ways it is left as
  the preceding lookup of the same ct_lookup4 set it (the reverse-direction miss: non-zero);
- hooks without a CT lookup (to-overlay, to-netdev here) pass monitor 0.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from labtag import tagged
from pathlib import Path

from .util import TcpClient, wait_for

SEGMENTS = 100
SCHEMA = Path(__file__).resolve().parents[1] / "unit" / "data" / "hubble-flow.schema.json"

#: labkit hooks whose records are from-* observation points (trace.h trace_obs_point: from-netdev is
#: from-network, from-overlay is from-overlay; from-container reports where the packet goes next).
FROM_HOOKS = {"from-netdev", "from-overlay"}
#: labkit hooks whose forwarded records Cilium never sends (trace.h trace_reported: cil_to_overlay and XDP send
#: drop notifications only).
SILENT_HOOKS = {"to-overlay"}


def _connection_records(lab, port: int) -> list:
    """Every record of the TCP connection with client port ``port`` (inner packet for VXLAN records)."""
    from labkit.observe.monitor import flushed_past

    flushed_past(lab.name, lab.pin_dirs)
    out = []
    for f in lab.events().read():
        for t in (f.event.before, f.event.inner):
            if t.proto == socket.IPPROTO_TCP and port in (socket.ntohs(t.sport), socket.ntohs(t.dport)):
                out.append(f)
                break
    return out


def _run_connection(lab) -> int:
    """a1 (node-a) -> b1:8080 (node-b): handshake, SEGMENTS echoed data segments, close. The client port."""
    client = TcpClient(lab, "a1", lab.pod("b1").ip)
    for _ in range(SEGMENTS):
        assert client.send() == "echo hello labkit"
    client.close()
    return client.port


@pytest.mark.parametrize("level", ["none", "lowest", "low", "medium", "maximum"])
def test_reported_events_of_one_connection_per_level(lab, level):
    """One TCP connection with 100 data segments: the records marked reported at each aggregation level
    are the ones Cilium's rules let through (medium/maximum: 16, counted by hand below)."""
    from labkit.observe.trace import Report

    assert lab.monitor_aggregation(level) == level
    start = lab.clock.now()
    port = _run_connection(lab)
    if lab.clock.now() - start > 5:
        pytest.fail("the connection took over CT_REPORT_INTERVAL (5 s): interval reports would add events")
    records = _connection_records(lab, port)
    reported = [f for f in records if f.event.report & Report.REPORTED]
    hooks = [f.hook.label for f in records]
    assert hooks.count("from-container") >= 2 * SEGMENTS + 6  # both pods sent every segment, handshake and FIN
    # cil_to_overlay sends drop notifications only (bpf/bpf_overlay.c:742-801@82999990): its records never count
    if level == "none":
        expected = sum(1 for h in hooks if h not in SILENT_HOOKS)  # every notification
    elif level in ("lowest", "low"):
        expected = sum(1 for h in hooks if h not in FROM_HOOKS | SILENT_HOOKS)  # every notification but the from-* ones
    else:
        # By hand, per CT entry direction (flags seen, in order) at the two pod hooks of each node:
        #   node-a from-container, client -> server (OUT tx): SYN (new), ACK (flag ACK new),
        #     first data (PSH new), FIN (close), last ACK (entry closed both ways: reverse miss)   = 5
        #   node-a to-container, server -> client (OUT rx): SYN-ACK (SYN, ACK new), first echo
        #     (PSH new), FIN (close)                                                                  = 3
        #   node-b to-container, client -> server (IN rx): SYN (miss, new), ACK, first data, FIN,
        #     last ACK (closed both ways)                                                            = 5
        #   node-b from-container, server -> client (IN tx): SYN-ACK, first echo, FIN                = 3
        # The other 99 segments each way and every pure ACK change no flag within 5 s; to-overlay and
        # to-netdev have no CT lookup (monitor 0); from-netdev and from-overlay are from-* points.
        expected = 5 + 3 + 5 + 3
    assert len(reported) == expected, [(f.node, f.hook.label, f.event.before.tcp_flags) for f in reported]
    if level in ("medium", "maximum"):
        by_hook = {}
        for f in reported:
            by_hook[(f.node, f.hook.label)] = by_hook.get((f.node, f.hook.label), 0) + 1
        assert by_hook == {("node-a", "from-container"): 5, ("node-a", "to-container"): 3,
                           ("node-b", "to-container"): 5, ("node-b", "from-container"): 3}
    assert len(records) > expected or level == "none"  # the stream itself keeps every hop


def test_drops_are_reported_at_every_level(lab):
    """A drop is reported even at maximum aggregation (bpf/lib/drop.h's send_drop_notify does not aggregate),
    and reaches the Hubble ring as a DROPPED flow with its reason."""
    from labkit.constants import DropReason
    from labkit.observe.trace import Report

    lab.monitor_aggregation("maximum")
    lab.fault("no-tunnel")  # from-container finds no tunnel endpoint: DROP_NO_TUNNEL_ENDPOINT
    try:
        step = lab.pod("a1").ping("b1")
    finally:
        lab.fault("no-tunnel", on=False)
    drops = [f for f in step.flows if f.dropped]
    assert drops and all(f.event.report & Report.REPORTED for f in drops)
    assert {f.event.drop_reason for f in drops} == {DropReason.NO_TUNNEL_ENDPOINT}
    out = subprocess.run([sys.executable, "-m", "labkit", "cli", "--lab", lab.name, "observe", "-o", "json",
                          "--verdict", "DROPPED", "--last", "1"], capture_output=True, text=True, timeout=60)
    flow = json.loads(out.stdout)["flow"]
    assert (flow["verdict"], flow["drop_reason_desc"], flow["event_type"]) == \
        ("DROPPED", "NO_TUNNEL_OR_ENCAPSULATION_ENDPOINT", {"type": 1, "sub_type": 160})
    assert "is_reply" not in flow  # drops: direction unknown (decodeIsReply)
    from labkit.observe.hubble import FlowFilter, last_flows

    assert last_flows(lab, FlowFilter(verdicts=["DROPPED"]), last=1) == [json.loads(out.stdout)]


def test_observe_json_lines_validate_and_filter(lab):
    """`labkit observe -o json` prints GetFlowsResponse lines valid against Hubble's flow schema; --from-pod,
    --protocol and --port select exactly the flows of the connection."""
    import jsonschema

    from labkit.observe.monitor import flushed_past

    lab.monitor_aggregation("medium")
    port = _run_connection(lab)
    flushed_past(lab.name, lab.pin_dirs)
    out = subprocess.run([sys.executable, "-m", "labkit", "cli", "--lab", lab.name, "observe", "-o", "json",
                          "--last", "4095", "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()), format_checker=jsonschema.FormatChecker())
    for line in lines:
        validator.validate(line)
    flows = [r["flow"] for r in lines if "flow" in r]
    assert len(flows) == 16  # what medium reported (see the test above)
    assert {f["node_name"] for f in flows} == {"node-a", "node-b"}
    assert all(port in (f["l4"]["TCP"].get("source_port"), f["l4"]["TCP"].get("destination_port")) for f in flows)
    first = flows[0]
    assert (first["l4"]["TCP"]["flags"], first["trace_observation_point"], first["is_reply"]) == \
        ({"SYN": True}, "TO_OVERLAY", False)
    assert first["source"]["pod_name"] == "a1" and first["destination"]["pod_name"] == "b1"
    out = subprocess.run([sys.executable, "-m", "labkit", "cli", "--lab", lab.name, "observe", "--last", "4095",
                          "--from-pod", "b1", "--port", str(port), "--protocol", "tcp"],
                         capture_output=True, text=True, timeout=60)
    # An EVENTS LOST line is no flow and passes every filter, as in Hubble (an earlier test may have flooded this
    # shared lab's rings): only the flows are counted.
    compact = [line for line in out.stdout.splitlines() if not line.startswith("EVENTS LOST")]
    assert len(compact) == 3 + 3  # b1's sends: SYN-ACK, first echo, FIN at node-b from-container and at node-a to-container
    assert all(" <- default/b1:8080 (ID:" in line for line in compact), compact


def test_observe_follow_prints_new_flows_as_they_come(lab):
    """`labkit observe --follow` prints nothing old and then each newly reported flow of the connection."""
    lab.monitor_aggregation("medium")
    proc = subprocess.Popen([sys.executable, "-m", "labkit", "cli", "--lab", lab.name, "observe", "--follow",
                             "-o", "json", "--from-pod", "a1", "--protocol", "tcp"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)  # the reader is at the end of the ring before the connection starts
        port = _run_connection(lab)
        lines = []
        deadline = time.monotonic() + 10
        while len(lines) < 8 and time.monotonic() < deadline:
            line = json.loads(proc.stdout.readline())
            if "flow" in line:  # a lost_events line (the rings of this shared lab overran earlier) is no flow
                lines.append(line)
    finally:
        proc.terminate()
        proc.wait(5)
    # a1's packets at medium: node-a from-container 5 and node-b to-container 5 (see the per-level test) ... of
    # which the first 8 in time order; every one is this connection's, none older.
    assert len(lines) == 8
    assert all(r["flow"]["l4"]["TCP"]["source_port"] == port for r in lines)
    assert all(r["flow"]["source"]["pod_name"] == "a1" for r in lines)


@pytest.fixture(scope="module")
def _observe_lab(_require_datapath):
    from labkit.config import DatapathConfig

    from .conftest import _shared_lab

    yield from _shared_lab(tagged("dpobserve"), DatapathConfig(routing="tunnel", gc_timer=False, ct_accounting=True))


@pytest.fixture
def lab(_observe_lab):
    """A tunnel lab of this module's own, healed and reset for each test: its Hubble ring (which a reset keeps,
    as Hubble keeps its history) holds only this module's connections, so a port filter finds no older flow of
    another file that happened to use the same client port."""
    return _observe_lab.get()


@pytest.fixture(scope="module")
def small_ring_lab(_require_datapath):
    """A lab whose nodes' labkit_events rings hold 2 pages (8 KiB, about 75 records), on the 1.20 profile: its
    ``hubble observe`` prints lost events (v1.16's prints none: tests/datapath/test_hubble_json.py)."""
    from labkit import Lab
    from labkit.config import DatapathConfig

    lab = Lab.up(tagged("obflood"), config=DatapathConfig(events_ring_pages=2, monitor_aggregation="none",
                                                            gc_timer=False, cilium="1.20"))
    yield lab
    lab.down()


def test_flood_keeps_newest_4095_and_reports_lost_events(small_ring_lab):
    """A UDP flood beyond both rings: the kernel ring overflows and the loss shows as lost-event entries
    (PERF_EVENT_RING_BUFFER) whose counts add up to the datapath's counters; the Hubble ring keeps exactly
    the newest 4,095 entries, the last reported records of the trace stream, in order."""
    import ctypes

    from labkit.maps.base import PinnedMap
    from labkit.net.ledger import lab_dir
    from labkit.observe.hubble import Names, response
    from labkit.observe.monitor import flushed_past
    from labkit.observe.ring import SLOT_FLOW, SLOT_LOST, HubbleRing
    from labkit.observe.trace import Report

    lab = small_ring_lab
    log = lab.events()
    log.seek_end()
    flood = ("import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
             f"for i in range(30000): s.sendto(b'x', ('{lab.pod('a2').ip}', 9))")
    assert lab.pod("a1").exec(sys.executable, "-c", flood, timeout=120).returncode == 0
    flushed_past(lab.name, lab.pin_dirs)

    class U32(ctypes.c_uint32):
        pass

    def counters() -> dict[int, int]:
        """node id -> labkit_events_lost of that node."""
        out = {}
        for node, pin in lab.pin_dirs.items():
            with PinnedMap(f"{pin}/labkit_events_lost", U32, ctypes.c_uint64) as m:
                out[lab.topology.node(node).node_id] = m[U32(0)].value
        return out

    lost = counters()
    assert sum(lost.values()) > 0, "the 8 KiB rings never overflowed: make the flood bigger"

    def newest_totals():
        ring = HubbleRing.open(lab_dir(lab.name) / "hubble.ring")
        try:
            slots = ring.entries()
        finally:
            ring.close()
        totals = {}
        for s in slots:
            if s.kind == SLOT_LOST:
                totals[s.node_id] = s.lost_total
        return ring, slots, totals

    # Every increment of a node's counter became lost events: its newest lost entry carries the counter.
    ring, slots, totals = wait_for(lambda: (r := newest_totals())[2] == {n: v for n, v in lost.items() if v} and r,
                                   timeout=5, what="lost-event entries carrying the counters")
    # Older lost entries may have left the ring; those still in it add up to at most the counters.
    assert sum(s.lost for s in slots if s.kind == SLOT_LOST) <= sum(lost.values())
    assert ring.capacity == 4095 and len(slots) == 4095 and ring.written > 4095
    assert [s.seq for s in slots] == list(range(ring.written - 4095, ring.written))
    reported = [f.event for f in log.read() if f.event.report & Report.REPORTED]
    flows = [s.event for s in slots if s.kind == SLOT_FLOW]
    assert [bytes(e) for e in flows] == [bytes(e) for e in reported[-len(flows):]]
    names = Names.from_topology(lab.topology)
    lost_resp = [response(s, names) for s in slots if s.kind == SLOT_LOST]
    assert lost_resp and all(r["lost_events"]["source"] == "PERF_EVENT_RING_BUFFER" for r in lost_resp)
    out = subprocess.run([sys.executable, "-m", "labkit", "cli", "--lab", lab.name, "observe", "--last", "5000"],
                         capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    assert len(lines) == 4095 and any(line.startswith("EVENTS LOST: PERF_EVENT_RING_BUFFER CPU(0) ") for line in lines)


def test_fault_hubble_no_aggregation_fills_the_ring_with_unreported_records(lab):
    """hubble-no-aggregation (an agent fault, lab 13's break-it): the datapath still marks what medium reports, but
    the monitor puts every record of the connection into the Hubble ring; switched off, only the reported ones."""
    from labkit.observe.hubble import FlowFilter, last_flows
    from labkit.observe.trace import Report

    lab.monitor_aggregation("medium")
    counts = {}
    for on in (True, False):
        lab.fault("hubble-no-aggregation", on=on)
        try:
            port = _run_connection(lab)
            records = _connection_records(lab, port)
        finally:
            lab.fault("hubble-no-aggregation", on=False)
        # every record whose packet carries the port: the pods' and the tunnel's hooks, not eth0's outer packet
        carrying = [f for f in records if port in (socket.ntohs(f.event.before.sport), socket.ntohs(f.event.before.dport))]
        reported = [f for f in records if f.event.report & Report.REPORTED]
        # lost-event entries pass every filter (an earlier test may have overrun this shared lab's rings): flows only
        flows = [r for r in last_flows(lab, FlowFilter(ports=[port])) if "flow" in r]
        counts[on] = (len(flows), len(carrying), len(reported))
    assert counts[True][0] == counts[True][1] > counts[True][2] == 16
    assert counts[False][0] == counts[False][2] == 16


def test_fault_monitor_no_lost_hides_the_loss(small_ring_lab):
    """monitor-no-lost (an agent fault, lab 13's flood exercise): the nodes' lost counters grow under a flood but
    no lost-event entry reaches the Hubble ring."""
    import ctypes

    from labkit.maps.base import PinnedMap
    from labkit.net.ledger import lab_dir
    from labkit.observe.monitor import flushed_past
    from labkit.observe.ring import SLOT_LOST, HubbleRing

    lab = small_ring_lab

    class U32(ctypes.c_uint32):
        pass

    def lost_total() -> int:
        total = 0
        for pin in lab.pin_dirs.values():
            with PinnedMap(f"{pin}/labkit_events_lost", U32, ctypes.c_uint64) as m:
                total += m[U32(0)].value
        return total

    def ring_written() -> int:
        ring = HubbleRing.open(lab_dir(lab.name) / "hubble.ring")
        try:
            return ring.refresh()
        finally:
            ring.close()

    before, start = lost_total(), ring_written()
    lab.fault("monitor-no-lost")
    try:
        flood = ("import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
                 f"for i in range(30000): s.sendto(b'x', ('{lab.pod('a2').ip}', 9))")
        assert lab.pod("a1").exec(sys.executable, "-c", flood, timeout=120).returncode == 0
        flushed_past(lab.name, lab.pin_dirs)
        time.sleep(0.5)  # the monitor's next drains look at the counters
        ring = HubbleRing.open(lab_dir(lab.name) / "hubble.ring")
        try:
            new = ring.read(max(start, ring.oldest()))[0]
        finally:
            ring.close()
    finally:
        lab.fault("monitor-no-lost", on=False)
    assert lost_total() > before, "the 8 KiB rings never overflowed: make the flood bigger"
    assert new and not [s for s in new if s.kind == SLOT_LOST]
