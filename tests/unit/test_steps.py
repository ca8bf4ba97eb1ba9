"""Steps without a lab: where a packet's journey ends (labkit.notebook.steps)."""
from __future__ import annotations

from labkit.addr import be32
from labkit.notebook.steps import Journey
from labkit.observe.trace import Flow
from tracefixtures import syn_event, tup


def test_journey_ends_at_a_node_or_outside_the_cluster():
    """A packet's journey ends at from-netdev when it is delivered to that node's own address, and at
    to-netdev only when it leaves for an address that is neither a pod nor a node."""
    nodes = {1: be32("198.51.100.11"), 2: be32("198.51.100.12")}
    pods = {be32("198.18.2.11")}
    j = Journey("reply", None, None, 6, None, 40000)
    to_node = tup("198.18.2.11", 8080, "198.51.100.11", 40000, 6, 0x12)
    leaving = Flow(syn_event(hook=4, node_id=2, before=to_node, after=to_node), "node-b", "eth0")
    assert not j.ended_by(leaving, pods, nodes)  # towards node-a: not yet
    arriving = Flow(syn_event(hook=3, node_id=1, before=to_node, after=to_node), "node-a", "eth0")
    assert j.ended_by(arriving, pods, nodes)  # delivered to node-a itself
    to_ext = tup("203.0.113.10", 80, "198.51.100.100", 40000, 6, 0x12)
    translated = Flow(syn_event(hook=3, node_id=1, before=to_node, after=to_ext), "node-a", "eth0")
    assert not j.ended_by(translated, pods, nodes)  # rewritten for ext: it goes on
    assert j.ended_by(Flow(syn_event(hook=4, node_id=1, before=to_ext, after=to_ext), "node-a", "eth0"), pods, nodes)
