"""The ladder (sequence) diagram of one connection: hosts and hooks as columns, time downwards.

The picture a networking course draws for a TCP connection, with labkit's
hooks in it. Columns, left to right: the client (``a1``), the devices whose
hooks reported the connection's packets in the order the first packet met
them (node-a's ``lxc-a1``, ``cilium_vxlan``, ``eth0``, then node-b's), and the
server (``b1``). Each packet is one arrow, from its sender through a dot at
every hook that reported it to its receiver, labelled with its TCP flags
(``SYN``, ``SYN-ACK``, ``ACK``, ``PSH-ACK``, ``FIN-ACK``, ``RST``). Beside each
dot, and again in the notes on the right:

* the hook and its CT verdict (``from-container ct=new/egress``),
* the CT row it created (``+ TCP OUT 198.18.1.11:40000 -> 198.18.2.11:8080``,
  taken from the step's CT diff) or the flags it changed
  (``Flags [ +TxClosing ]``, from the flag word the record carries),
* NAT done at that hook (``DNAT → 198.18.2.11:8080`` at from-container,
  ``rev-NAT`` at to-container, ``SNAT → 169.254.42.1``) and the trace tags
  (``[dsr-opt-added]``, ``[dsr-opt-stripped]``).

A packet is followed from hook to hook by its addresses: a record continues
the packet whose last record left with the addresses this one arrived with
(the inner packet for VXLAN), and a packet ends when it is delivered into a
pod (to-container) or dropped. Output is SVG, deterministic.

    >>> from labkit.net.topology import Topology
    >>> svg([], Topology.default("demo")).startswith("<svg")
    True
"""
from __future__ import annotations

import html
import socket
from dataclasses import dataclass, field
from typing import Sequence

from labkit.addr import ipv4
from labkit.constants import DropReason, Hook, TraceFlags, Verdict
from labkit.maps.ct import CtDir, CtFlags, CtResult, CtRow
from labkit.net.topology import Topology
from labkit.notebook.viz import VERDICT_COLOURS, ct_lookup
from labkit.observe.trace import Flow

__all__ = ["Packet", "packets", "flag_label", "created_rows", "hook_note", "svg"]

_FLAG_ORDER = (("SYN", 0x02), ("FIN", 0x01), ("RST", 0x04), ("PSH", 0x08), ("URG", 0x20), ("ACK", 0x10),
               ("ECE", 0x40), ("CWR", 0x80))
_EGRESS_HOOKS = (Hook.FROM_CONTAINER, Hook.TO_OVERLAY, Hook.TO_NETDEV)


def flag_label(flags: int) -> str:
    """TCP flags as a ladder labels a packet: ``SYN``, ``SYN-ACK``, ``FIN-ACK``, ``PSH-ACK``.

    >>> flag_label(0x12), flag_label(0x11), flag_label(0x18), flag_label(0)
    ('SYN-ACK', 'FIN-ACK', 'PSH-ACK', '-')
    """
    names = [name for name, bit in _FLAG_ORDER if flags & bit]
    return "-".join(names) if names else "-"


def _seen(ev):
    """The packet's own addresses as the hook received (``before``) and sent it (``after``): the inner
    packet of a VXLAN record."""
    if ev.inner.proto:
        return ev.inner, ev.inner
    return ev.before, ev.after


def _ident(t) -> tuple:
    return (t.saddr, t.daddr, t.sport, t.dport, t.proto, t.tcp_flags)


@dataclass
class Packet:
    """One packet of a connection: its records (hooks) in time order, who sent it and who got it.

    ``step`` is the index of the step that recorded it; ``src``/``dst`` are the
    endpoint names (pods, external clients) or ``None`` when unknown.
    """

    step: int
    flows: list[Flow] = field(default_factory=list)
    src: str | None = None
    dst: str | None = None
    ended: bool = False

    @property
    def flags(self) -> int:
        """The TCP flags of the packet (as its first hook saw it)."""
        return _seen(self.flows[0].event)[0].tcp_flags

    @property
    def label(self) -> str:
        """``SYN``, ``SYN-ACK``, ... (:func:`flag_label`); the protocol for non-TCP packets."""
        t = _seen(self.flows[0].event)[0]
        return flag_label(t.tcp_flags) if t.proto == 6 else {1: "ICMP", 17: "UDP"}.get(t.proto, str(t.proto))


def _endpoints(topology: Topology) -> dict[tuple[str, str], str]:
    return {(p.node, topology.host_veth(p.name)): p.name for p in topology.pods}


def _owner(topology: Topology, addr: int) -> str | None:
    name = topology.owner_of(ipv4(addr))
    if name is None:
        return None
    try:
        return name if topology.kind_of(name) in ("pod", "external") else None
    except Exception:  # noqa: BLE001 - a name the topology does not classify is not an endpoint
        return None


def packets(steps_flows: Sequence[Sequence[Flow]], topology: Topology) -> list[Packet]:
    """The packets of a connection, from its steps' records (one list of flows per step).

    >>> packets([[]], Topology.default("demo"))
    []
    """
    lxc_pod = _endpoints(topology)
    out: list[Packet] = []
    for k, flows in enumerate(steps_flows):
        open_: list[Packet] = []
        for flow in sorted(flows, key=lambda f: f.event.ts_ns):
            ev = flow.event
            arrived, _ = _seen(ev)
            where = (flow.node, flow.device, ev.hook)
            owner = None
            if ev.hook != Hook.FROM_CONTAINER:
                for p in reversed(open_):
                    last = p.flows[-1].event
                    if _ident(_seen(last)[1]) == _ident(arrived) and where not in {
                            (f.node, f.device, f.event.hook) for f in p.flows}:
                        owner = p
                        break
            if owner is None:
                owner = Packet(k)
                if ev.hook == Hook.FROM_CONTAINER:
                    owner.src = lxc_pod.get((flow.node, flow.device))
                else:
                    owner.src = _owner(topology, arrived.saddr)
                out.append(owner)
                open_.append(owner)
            owner.flows.append(flow)
            if ev.verdict == Verdict.DROPPED or ev.hook == Hook.TO_CONTAINER:
                owner.ended = True
                open_.remove(owner)
        for p in out:
            if p.step != k or p.dst is not None:
                continue
            last = p.flows[-1]
            if last.event.verdict == Verdict.DROPPED:
                continue
            if last.event.hook == Hook.TO_CONTAINER:
                p.dst = lxc_pod.get((last.node, last.device))
            else:
                p.dst = _owner(topology, _seen(last.event)[1].daddr)
    return out


def _nat_marks(flow: Flow) -> list[str]:
    """NAT at this hook: a changed destination is DNAT (rev-SNAT on a reply), a changed source SNAT
    (rev-NAT on a reply, the Service's address put back); the trace tags say which when they are set."""
    ev = flow.event
    before, after = ev.before, ev.after
    tags = TraceFlags(ev.flags)
    reply = ev.ct_result == CtResult.REPLY
    marks = []
    if (before.daddr, before.dport) != (after.daddr, after.dport):
        kind = "rev-SNAT" if tags & TraceFlags.REV_SNAT or reply else "DNAT"
        marks.append(f"{kind} → {ipv4(after.daddr)}:{socket.ntohs(after.dport)}")
    if (before.saddr, before.sport) != (after.saddr, after.sport):
        kind = "SNAT" if tags & TraceFlags.SNAT or not reply else "rev-NAT"
        marks.append(f"{kind} → {ipv4(after.saddr)}:{socket.ntohs(after.sport)}")
    marks += [f"[{name}]" for name in TraceFlags.names(ev.flags)]
    return marks


def _ct_text(flow: Flow) -> str:
    ev = flow.event
    if ev.ct_result == CtResult.NONE:
        return ""
    return f"ct={ct_lookup(ev)}"


def _matches(row: CtRow, flow: Flow) -> bool:
    ev = flow.event
    ends = set()
    for t in (ev.before, ev.after):
        a = (ipv4(t.saddr), socket.ntohs(t.sport))
        b = (ipv4(t.daddr), socket.ntohs(t.dport))
        ends.add((a, b))
        ends.add((b, a))
    return row.proto == ev.before.proto and ((row.src, row.sport), (row.dst, row.dport)) in ends


def created_rows(flow: Flow, created: Sequence[CtRow]) -> list[CtRow]:
    """The rows of ``created`` that ``flow``'s CT lookup wrote: its packet's addresses (before or after
    NAT), of the lookup's direction (OUT for egress, IN for ingress) or the Service's row (SVC).

    >>> created_rows(None, [])
    []
    """
    if not created:
        return []
    want = {CtDir.EGRESS: "OUT", CtDir.INGRESS: "IN"}.get(flow.event.ct_dir)
    return [r for r in created if (r.dir == "SVC" or r.dir == want) and _matches(r, flow)]


def hook_note(flow: Flow, created: Sequence[CtRow] = (), flags_before: int | None = None) -> str:
    """What a ladder writes at one hook: the hook, its CT verdict, the rows it created (those of
    ``created`` whose addresses are the packet's, before or after NAT), the flags it changed, NAT
    and trace tags.

    >>> from tracefixtures import syn_event  # doctest: +SKIP
    >>> hook_note(Flow(syn_event(), "node-a", "lxc-a1"))  # doctest: +SKIP
    'from-container ct=new/egress'
    """
    parts = [Hook(flow.event.hook).label if flow.event.hook in Hook._value2member_map_ else f"hook#{flow.event.hook}"]
    ct = _ct_text(flow)
    if ct:
        parts.append(ct)
        if flow.event.ct_result == CtResult.NEW:
            parts += [f"+ {row.proto_name} {row.dir} {row.flow()}{' related' if row.related else ''}"
                      for row in created_rows(flow, created)]
        if flags_before is not None and flags_before != flow.event.ct_flags:
            new, old = flow.event.ct_flags, flags_before
            names = [f"+{n}" for n in CtFlags.names(new & ~old)] + [f"−{n}" for n in CtFlags.names(old & ~new)]
            if names:
                parts.append(f"Flags [ {' '.join(names)} ]")
    parts += _nat_marks(flow)
    if flow.event.verdict == Verdict.DROPPED:
        parts.append(f"dropped: {DropReason.text(flow.event.drop_reason)}")
    return " · ".join(parts)


# -- drawing -----------------------------------------------------------------
_COL_W = 118.0
_LEFT = 20.0
_TOP = 84.0
_ROW = 17.0
_PACKET_GAP = 8.0
_STEP_GAP = 26.0
_NOTE_W = 520.0


def _n(v: float) -> str:
    text = f"{v:.1f}"
    return "0.0" if text == "-0.0" else text


def _esc(text: str) -> str:
    return html.escape(str(text), quote=True)


def _columns(pkts: Sequence[Packet]) -> list[tuple[str, str]]:
    """(kind, id): ('end', 'a1') or ('dev', 'node-a/lxc-a1'), left to right."""
    cols: list[tuple[str, str]] = []
    first_src = next((p.src for p in pkts if p.src), None)
    if first_src:
        cols.append(("end", first_src))
    for p in pkts:
        for f in p.flows:
            c = ("dev", f"{f.node}/{f.device}")
            if c not in cols:
                cols.append(c)
    for p in pkts:
        for name in (p.src, p.dst):
            if name and ("end", name) not in cols:
                cols.append(("end", name))
    return cols


def svg(steps: Sequence, topology: Topology, title: str | None = None) -> str:
    """The ladder of one connection's steps (objects with ``flows``, ``diff`` and ``title``, such as
    :class:`labkit.notebook.steps.Step`), as SVG text: deterministic, ``viewBox`` and ``max-width:100%``.

    >>> "no packets" in svg([], Topology.default("demo"))
    True
    """
    flows_of = [list(getattr(s, "flows", s)) for s in steps]
    pkts = packets(flows_of, topology)
    cols = _columns(pkts)
    x_of = {c: _LEFT + _COL_W * (i + 0.5) for i, c in enumerate(cols)}
    longest = 0  # characters of the longest note, for the width
    body: list[str] = []

    # rows: one per hop, packets apart, steps apart (with the step's title)
    y = _TOP
    last_step = None
    flags_at: dict[tuple, int] = {}
    created_of: dict[int, dict[str, list[CtRow]]] = {}
    for k, s in enumerate(steps):
        diff = getattr(s, "diff", {}) or {}
        created_of[k] = {node: list(d.added) for node, d in diff.items()}
    note_x = _LEFT + _COL_W * max(len(cols), 1) + 10
    hop_no = 0
    rules: list[float] = []
    for p in pkts:
        if p.step != last_step:
            if last_step is not None:
                y += _STEP_GAP
            step_title = getattr(steps[p.step], "title", f"step {p.step + 1}") if p.step < len(steps) else ""
            body.append(f'<text class="step-title" x="{_n(_LEFT)}" y="{_n(y)}" font-size="11" font-weight="bold" '
                        f'fill="#333">{_esc(step_title)}</text>')
            rules.append(y + 5)
            y += 16
            last_step = p.step
        colour = VERDICT_COLOURS["DROPPED"] if p.flows[-1].event.verdict == Verdict.DROPPED else "#37474f"
        points = []
        if p.src and ("end", p.src) in x_of:
            points.append((x_of[("end", p.src)], y))
        dots = []
        for f in p.flows:
            y += _ROW
            hop_no += 1
            x = x_of[("dev", f"{f.node}/{f.device}")]
            points.append((x, y))
            svc = f.event.ct_dir == CtDir.SERVICE
            key = (f.node, svc)
            prev = flags_at.get(key) if f.event.ct_result != CtResult.NONE else None
            if f.event.ct_result != CtResult.NONE:
                flags_at[key] = f.event.ct_flags
            remaining = created_of.get(p.step, {}).get(f.node, [])
            made = created_rows(f, remaining) if f.event.ct_result == CtResult.NEW else []
            for row in made:  # each created row is told once, where it was first written
                remaining.remove(row)
            note = hook_note(f, made, prev)
            dots.append((x, y, f, note, hop_no))
        if p.dst and ("end", p.dst) in x_of:
            y += _ROW
            points.append((x_of[("end", p.dst)], y))
        path = " ".join(f"{'M' if i == 0 else 'L'}{_n(px)},{_n(py)}" for i, (px, py) in enumerate(points))
        lx, ly = (points[0][0] + points[1][0]) / 2 if len(points) > 1 else points[0][0], points[0][1] + 4
        body.append(f'<g class="packet" data-flags="{_esc(p.label)}" data-step="{p.step}" '
                    f'data-src="{_esc(p.src or "")}" data-dst="{_esc(p.dst or "")}" data-hooks="{len(p.flows)}">'
                    f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="1.6" '
                    f'marker-end="url(#lk-ladder-arrow)"/>'
                    f'<text class="flags" x="{_n(lx)}" y="{_n(ly - 6)}" font-size="10" font-weight="bold" '
                    f'text-anchor="middle" fill="{colour}">{_esc(p.label)}</text></g>')
        for x, yy, f, note, n in dots:
            nat = [m.split(" ")[0] for m in _nat_marks(f)]
            if nat:  # where the rewrite happens, on the lifeline itself
                body.append(f'<text class="nat" x="{_n(x - 6)}" y="{_n(yy + 3)}" font-size="8" font-weight="bold" '
                            f'text-anchor="end" fill="#e65100">{_esc(" ".join(nat))}</text>')
            verdict = Verdict(f.event.verdict).name if f.event.verdict in Verdict._value2member_map_ else "?"
            fill = VERDICT_COLOURS.get(verdict, "#616161")
            short = note.split(" · ", 1)[1] if " · " in note else ""
            body.append(f'<g class="hook" data-n="{n}" data-node="{_esc(f.node)}" data-device="{_esc(f.device)}" '
                        f'data-hook="{_esc(note.split(" · ")[0])}" data-ct="{_esc(_ct_text(f))}" '
                        f'data-note="{_esc(note)}"><title>{_esc(f"{f.node} {f.device} {note}")}</title>'
                        f'<circle cx="{_n(x)}" cy="{_n(yy)}" r="4" fill="{fill}" stroke="white" stroke-width="0.8"/>'
                        f'<text x="{_n(x + 6)}" y="{_n(yy - 3)}" font-size="8" fill="#555">{n}</text></g>')
            longest = max(longest, len(f"{n}. {f.node} {f.device} {note}"))
            body.append(f'<text class="note" x="{_n(note_x)}" y="{_n(yy + 3)}" font-size="9" fill="#333">'
                        f'{n}. {_esc(f.node)} {_esc(f.device)} {_esc(note.split(" · ")[0])}'
                        + (f' <tspan fill="#1565c0">{_esc(short)}</tspan>' if short else "") + "</text>")
        y += _PACKET_GAP
    if not pkts:
        body.append(f'<text x="{_n(_LEFT)}" y="{_n(_TOP + 10)}" font-size="11" fill="#666">no packets</text>')
        y += 20
    height = y + 20
    width = max(note_x + _NOTE_W, note_x + longest * 5.0 + _LEFT)
    body += [f'<line class="rule" x1="{_n(_LEFT)}" y1="{_n(r)}" x2="{_n(width - _LEFT)}" y2="{_n(r)}" stroke="#ccc" '
             f'stroke-width="1"/>' for r in rules]

    # column heads and lifelines
    hooks_at: dict[str, list[str]] = {}
    for p in pkts:
        for f in p.flows:
            label = Hook(f.event.hook).label if f.event.hook in Hook._value2member_map_ else f"hook#{f.event.hook}"
            seen = hooks_at.setdefault(f"{f.node}/{f.device}", [])
            if label not in seen:
                seen.append(label)
    heads = []
    for (kind, cid), x in x_of.items():
        if kind == "end":
            lines = [cid]
        else:
            node, dev = cid.split("/", 1)
            lines = [node, dev]
            for k, hook in enumerate(sorted(hooks_at.get(cid, []))):
                heads.append(f'<text class="column-hook" x="{_n(x)}" y="{_n(_TOP - 28 + 9 * k)}" font-size="7.5" '
                             f'text-anchor="middle" fill="#8a5a00">{_esc(hook)}</text>')
        heads.append(f'<line class="lifeline" x1="{_n(x)}" y1="{_n(_TOP - 12)}" x2="{_n(x)}" y2="{_n(height - 10)}" '
                     f'stroke="{"#7cb383" if kind == "end" else "#e0a100"}" stroke-width="1" '
                     f'stroke-dasharray="{"" if kind == "end" else "3 3"}"/>')
        for i, text in enumerate(lines):
            heads.append(f'<text class="column" data-column="{_esc(cid)}" x="{_n(x)}" y="{_n(30 + 13 * i)}" '
                         f'font-size="{11 if i == len(lines) - 1 else 9}" font-weight="bold" text-anchor="middle" '
                         f'fill="#222">{_esc(text)}</text>')
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" class="labkit-ladder" viewBox="0 0 {_n(width)} {_n(height)}" '
            f'width="{_n(width)}" height="{_n(height)}" style="max-width:100%;height:auto" font-family="sans-serif">')
    defs = ('<defs><marker id="lk-ladder-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#37474f"/></marker>'
            '</defs>')
    title_text = (f'<text class="title" x="{_n(width / 2)}" y="14" font-size="13" text-anchor="middle" '
                  f'fill="#222">{_esc(title or "ladder")}</text>')
    return "\n".join([head, defs, title_text, *heads, *body, "</svg>"]) + "\n"
