"""Steps without a lab: where a packet's journey ends (labkit.notebook.steps)."""
from __future__ import annotations

from labkit.addr import be32
from labkit.lab.traffic import Journey
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


# -- the step display ------------------------------------------------------------
from html.parser import HTMLParser  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from labkit.config import DatapathConfig  # noqa: E402
from labkit.maps.ct import CtEntry, CtFlags, CtKey4, CtRow  # noqa: E402
from labkit.net.topology import Topology  # noqa: E402
from labkit.notebook.steps import Step  # noqa: E402


class StepLab:
    """The little of a lab a Step's display reads: topology, routing, clock, the real commands."""

    def __init__(self, now: int = 1000):
        self.name = "demo"
        self.topology = Topology.default("demo")
        self.config = DatapathConfig()
        self.clock = SimpleNamespace(now=lambda: now)

    def ct_command(self, node: str) -> list[str]:
        return [f"ip netns exec lk-demo-{node} cilium-dbg bpf ct list global"]


class Cells(HTMLParser):
    """Text of every <td>, <li> and <summary>, with the style of each <td>, and what sits inside <details>."""

    def __init__(self, page: str):
        super().__init__()
        self.cells, self.items, self.summaries, self.folded = [], [], [], []
        self._open: list[tuple[str, dict]] = []
        self._depth = 0
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        if tag == "details":
            self._depth += 1
        if tag in ("td", "li", "summary"):
            self._open.append((tag, dict(attrs), []))

    def handle_endtag(self, tag):
        if tag == "details":
            self._depth -= 1
        if self._open and self._open[-1][0] == tag and tag in ("td", "li", "summary"):
            _, attrs, text = self._open.pop()
            joined = "".join(text)
            {"td": self.cells, "li": self.items, "summary": self.summaries}[tag].append((joined, attrs))

    def handle_data(self, data):
        for _, _, text in self._open:
            text.append(data)
        if self._depth:
            self.folded.append(data)


def close_step() -> Step:
    """A close step of a1 -> b1: node-a's OUT row gains RxClosing and TxClosing, one FIN record per hook."""
    key = CtKey4.make("198.18.1.11", "198.18.2.11", 40000, 8080, 6, 0)
    before = CtRow.of(key, CtEntry(lifetime=22600, flags=CtFlags.SEEN_NON_SYN, packets=5, tx_flags_seen=0x1a,
                                   rx_flags_seen=0x1a))
    after = CtRow.of(key, CtEntry(lifetime=1010, flags=0x0013, packets=7, tx_flags_seen=0x1b, rx_flags_seen=0x1b))
    fin = tup("198.18.1.11", 40000, "198.18.2.11", 8080, 6, 0x11)
    flows = [Flow(syn_event(ts_ns=10, before=fin, after=fin, ct_result=1, ct_flags=0x0012, flags=0x04), "node-a",
                  "lxc-a1"),
             Flow(syn_event(ts_ns=20, before=fin, after=fin, hook=2, node_id=2, verdict=3, drop_reason=-160,
                            tunnel_endpoint=0), "node-b", "lxc-b1")]
    return Step("a1 → b1:8080 TCP close", StepLab(), flows, {"node-a": [before], "node-b": []},
                {"node-a": [after], "node-b": []})


def test_step_display_one_list_with_tags_ct_and_drop():
    """The step shows one numbered hop list whose items carry the trace tags, the CT verdict and the drop
    reason; the timestamped records are folded under <details>, not shown a second time."""
    page = close_step()._repr_html_()
    parsed = Cells(page)
    items = [text for text, _ in parsed.items]
    assert len(items) == 2
    assert "[snat]" in items[0] and "ct=established/egress flags=[TxClosing SeenNonSyn]" in items[0]
    assert "dropped: No tunnel/encapsulation endpoint (datapath BUG!)" in items[1]
    assert page.count("<ol") == 1
    summaries = [text for text, _ in parsed.summaries]
    assert "2 trace records (raw, timestamped)" in summaries
    raw = "".join(parsed.folded)
    assert "198.18.1.11:40000 -> 198.18.2.11:8080 TCP FIN|ACK [snat]" in raw  # the raw line, folded


def test_step_diff_in_row_grammar():
    """A close step's diff names the flags gained (+RxClosing +TxClosing) in the row grammar, hex for the
    flag words, remaining seconds for the lifetime; cells are left-aligned and the node never wraps."""
    parsed = Cells(close_step()._repr_html_())
    rows = [(text, attrs) for text, attrs in parsed.cells]
    node_cells = [attrs for text, attrs in rows if text == "node-a"]
    assert node_cells and all("white-space:nowrap" in a["style"] for a in node_cells)
    assert all("text-align:left" in a["style"] for _, a in rows)
    [changed] = [text for text, _ in rows if text.startswith("TCP OUT")]
    assert "Flags=0x0010 → 0x0013 [ +RxClosing +TxClosing ]" in changed
    assert "TxFlagsSeen=0x1a → 0x1b" in changed and "RxFlagsSeen=0x1a → 0x1b" in changed
    assert "(remaining: 21600 → 10 sec(s))" in changed and "Packets=5 → 7" in changed
    assert "flags: 16" not in changed


def test_step_display_groups_repeats():
    """Three identical SYN records at one hook are one list item marked ×3."""
    syn = [Flow(syn_event(ts_ns=t), "node-a", "lxc-a1") for t in (1, 2, 3)]
    step = Step("retries", StepLab(), syn, {"node-a": []}, {"node-a": []})
    items = [text for text, _ in Cells(step._repr_html_()).items]
    assert len(items) == 1 and "×3" in items[0]


def test_step_save_svg_png_and_suffix(tmp_path):
    """save() writes the path picture as .svg (labkit's own SVG, an XML file) or .png (matplotlib) and
    refuses other suffixes with a ValueError naming the file."""
    import xml.etree.ElementTree as ET

    import pytest

    step = close_step()
    out = step.save(tmp_path / "path.svg")
    root = ET.parse(out).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg" and [g for g in root.iter() if g.get("class") == "badge"]
    with pytest.raises(ValueError, match="path.pdf"):
        step.save(tmp_path / "path.pdf")
    pytest.importorskip("matplotlib")
    png = step.save(tmp_path / "path.png")
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_step_ladder_view_saves_svg(tmp_path):
    """A step's ladder shows as SVG (_repr_svg_) and saves as .svg only."""
    import pytest

    view = close_step().ladder()
    assert view._repr_svg_().startswith("<svg") and "FIN-ACK" in view.svg
    assert open(view.save(tmp_path / "l.svg")).read().startswith("<?xml")
    with pytest.raises(ValueError):
        view.save(tmp_path / "l.png")


def test_step_display_shows_ladder_for_tcp_only():
    """A TCP step's display includes its ladder diagram; an ICMP step's does not."""
    assert "labkit-ladder" in close_step()._repr_html_()
    echo = tup("198.18.1.11", 7, "198.18.2.11", 0, 1, 0, 8)
    ping = Step("ping", StepLab(), [Flow(syn_event(before=echo, after=echo), "node-a", "lxc-a1")], {"node-a": []},
                {"node-a": []})
    assert "labkit-ladder" not in ping._repr_html_() and "labkit-path-svg" in ping._repr_html_()


def test_recorded_close_step_diff_names_closing_flags():
    """The close step recorded on the real datapath shows node-a's OUT row gaining RxClosing and TxClosing,
    in the row grammar, in its display."""
    from tracefixtures import recorded_steps

    closed = recorded_steps("a1-b1")[2]
    cells = [text for text, _ in Cells(closed._repr_html_()).cells]
    out = [c for c in cells if c.startswith("TCP OUT 198.18.1.11:")]
    assert len(out) == 1 and "Flags=0x0010 → 0x0013 [ +RxClosing +TxClosing ]" in out[0]
