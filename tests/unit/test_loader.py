"""labkit.datapath.loader.start: one loader process for a lab's nodes, each node's child on pipes of its own
(the datapath tests bring labs up through it; these pin the plumbing, without root)."""
from __future__ import annotations

import json

from labkit.datapath import loader


def test_each_node_answers_on_its_own_pipe_then_ends():
    """A spec a node's child cannot use comes back as that node's error line on that node's stdout, then its end of
    file; the process they share exits 0 once both children have."""
    loaders = loader.start({"node-a": {"node": "node-a"}, "node-b": {"node": "node-b", "pin_dir": "/nonexistent"}})
    assert list(loaders) == ["node-a", "node-b"]
    for node, handle in loaders.items():
        msg = json.loads(handle.stdout.readline())
        assert msg["error"] == "KeyError: 'topology'", node
        assert "Traceback" in msg["traceback"], node
        assert handle.stdout.readline() == "", f"{node}: its pipe stays open after its child ended"
    assert [h.wait(30) for h in loaders.values()] == [0, 0]


def test_killing_one_node_stops_the_shared_process():
    """kill() on a node's loader stops the process every node's child belongs to: the lab's way out on an error."""
    loaders = loader.start({"node-a": {"node": "node-a"}})
    handle = loaders["node-a"]
    handle.kill()
    assert handle.wait(30) != 0
    assert handle.poll() is not None
