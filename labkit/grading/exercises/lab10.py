"""Lab 10, identities and network policy: whom an identity stands for, where a denied SYN stops and what it
leaves, an established connection after its allow goes (and replies through a deny-all), the egress verdict
behind a Service, a hairpin through a deny-all, and a break-it fault that turns a reply into a new connection.

Graders read what the notebook's cells recorded: each step's trace records (the policy verdicts ride in them:
remote identity, direction, drop reason) and CT rows. The rules the answers follow are Cilium v1.16's:

- bpf_lxc.c ``handle_ipv4_from_lxc`` (egress) and ``ipv4_policy`` (ingress): ``CT_NEW`` and ``CT_ESTABLISHED``
  packets are checked against the endpoint's policy map; ``CT_REPLY`` and ``CT_RELATED`` skip policy ("Skip
  policy enforcement for return traffic"); a denied packet returns before ``ct_create4``, so it makes no row
  at that hook; the egress verdict is taken after the service lookup, on the DNATed destination's identity
  (cilium_ipcache) and port; at ingress a new packet from IPV4_LOOPBACK whose OUT entry is a loopback one, or
  one whose entry carries ``loopback``, skips policy (the hairpin).
- bpf/lib/policy.h ``__policy_can_access``: the lookup key is the peer's identity, protocol and port; no match
  is DROP_POLICY (-133, "Policy denied").
- pkg/identity (cache allocation): an identity stands for a label set, so pods with equal labels share it.

(tests/bpf/test_policy.py pins the same rules packet by packet.)
"""
from __future__ import annotations

from typing import Any

from labkit.constants import DropReason, Hook
from labkit.grading.checks import Outcome, compare_rows, exercise
from labkit.grading.exercises.common import (broken_step, dst, hook_name, is_syn, kinds_answer, row_kind, src,
                                             step_rows, unhealthy)
from labkit.maps.ct import CtFlags
from labkit.net.topology import LOOPBACK_SNAT_ADDR

WHO, DENIED, ESTAB, SVC, HAIRPIN, BREAK = (
    "1. Who may call b1", "2. A denied SYN", "3. Established, then the allow goes", "4. Policy behind a Service",
    "5. Hairpin under deny-all", "6. Break it")
_FAULT = "no-out-entry"  #: section 6's fault, left out of the evidence of sections 1-4
_CLEAN = {"faults": lambda f: _FAULT not in f}


def _verdicts(step, node: str, hook: Hook, sport: int | None) -> list:
    """The step's records at ``node``/``hook`` that carry a policy verdict, of the client port ``sport``."""
    return [f for f in step.flows if f.node == node and f.hook == hook and f.policy is not None
            and sport in (src(f.event.before)[1], dst(f.event.before)[1])]


def _ct_name(text: Any) -> str:
    """A CT state as the learner wrote it: ``'ct=reply'``, ``'CT_REPLY'``, ``'Reply'`` -> ``'reply'``."""
    name = str(text).strip().lower()
    for prefix in ("ct=", "ct_", "ct "):
        name = name[len(prefix):] if name.startswith(prefix) else name
    return name.split("/")[0]


def _pods_with(ev, identity: int) -> list[str]:
    return sorted(p.name for p in ev.topology.pods if p.identity == identity)


def _pod_names(answer: Any) -> list[str] | None:
    if isinstance(answer, str):
        answer = answer.replace(",", " ").split()
    if not isinstance(answer, (list, tuple, set)) or not all(isinstance(a, str) for a in answer):
        return None
    return sorted({a.strip().lower() for a in answer})


# -- 10.1 ---------------------------------------------------------------------------------
@exercise(
    "10.1",
    "Whom an identity stands for",
    hints=(
        "The verdict on b1's side names the caller by identity, not by address: read the `(ID:…)` on the line of "
        "a2's SYN at node-b's to-container.",
        "Compare that number with lab.pod(name).identity for every pod (or `labkit identity list`): an identity "
        "belongs to a set of labels.",
        "The answer is ['a1', 'a2']: a2 carries app=a1, so it has a1's identity, and b1's rule for app=a1 admits it.",
    ),
    fault="no-tunnel",
    cells=(WHO,),
)
def shared_identity(answer, ev) -> Outcome:
    """The pods that carry the identity b1's ingress verdict saw on a2's SYN (section 1's open), by identity."""
    step = ev.step(op="tcp-open", actor="a2", target="b1", port=8080, **_CLEAN)
    if step is None:
        return Outcome.needs(WHO, "a2's connection to b1 records the verdict node-b took on it")
    syns = [f for f in _verdicts(step, "node-b", Hook.TO_CONTAINER, step.attrs.get("sport")) if is_syn(f.event.before)]
    if not step.ok or not syns or syns[0].policy.denied or syns[0].policy.egress:
        saw = "a2's SYN allowed into b1" if syns and not syns[0].policy.denied else \
            ("a2's SYN denied at b1" if syns else "no policy verdict on a2's SYN at node-b")
        return unhealthy(WHO, f"{saw}, and connect() {'succeeding' if step.ok else 'failing'}", step)
    ident = syns[0].event.remote_id
    live = _pods_with(ev, ident)
    got = _pod_names(answer)
    if got is None:
        return Outcome(False, f"expected a list of pod names such as ['b2'], got {answer!r}.")
    out = compare_rows(live, got, f"pods with identity {ident}")
    if out.passed:
        return Outcome(True, f"identity {ident} is the label set app=a1 (with the namespace's labels), and both "
                             f"{' and '.join(live)} carry it: the agent allocates one identity per label set, not per "
                             "pod. b1's map holds that identity on 8080/TCP, so it admits a2 exactly as it admits a1; "
                             "a policy cannot tell apart two pods with equal labels.", out.diff)
    have = set(got)
    if have == {"a2"}:
        msg = "an identity does not belong to one pod: it stands for a set of labels. Compare every pod's labels."
    elif have == {"a1"}:
        msg = "the rule names app=a1, but the verdict on a2's SYN names the identity a2 itself carries."
    elif {"b1", "b2"} & have:
        msg = "pods on node-b carry labels of their own: an identity is a label set, not a node or a namespace."
    else:
        msg = out.message
    return Outcome(False, msg, out.diff, reveal=out.reveal)


# -- 10.2 ---------------------------------------------------------------------------------
@exercise(
    "10.2",
    "What a denied SYN leaves behind",
    hints=(
        "Find b2's SYN in the step's lines: on which line does it say DROPPED (Policy denied)? Then read node-b's "
        "rows the step left.",
        "b2 itself is selected by no policy; b1 is. Each hook creates its row only once its own policy check "
        "allowed the packet.",
        "The answer is ('to-container', ['TCP OUT']): b2's from-container made the OUT row, b1's to-container "
        "dropped the SYN before creating an IN row.",
    ),
    fault="no-out-entry",
    cells=(DENIED,),
)
def denied_syn(answer, ev) -> Outcome:
    """(hook that dropped b2's SYN with Policy denied, node-b's rows of that connection after it), from section
    2's failed open."""
    step = ev.step(op="tcp-open", actor="b2", target="b1", port=8080)
    if step is None:
        return Outcome.needs(DENIED, "b2's connection attempt to b1 records the drop and the rows")
    sport = step.attrs.get("sport")
    drops = [f for f in step.flows if f.dropped and is_syn(f.event.before) and src(f.event.before)[1] == sport]
    rows = [row_kind(r) for r in step_rows(step, "node-b", "TCP") if r.sport == sport and r.dport == 8080]
    # b2 is selected by no policy: its from-container must have let the SYN out and tracked it (bpf_lxc.c
    # handle_ipv4_from_lxc creates the OUT row once egress allowed the packet), or the world is not Cilium's.
    if step.ok or not drops or any(f.event.drop_reason != DropReason.POLICY for f in drops) \
            or "TCP OUT" not in rows or step.attrs.get("faults"):
        saw = "b2's connection to b1 opening" if step.ok else \
            "b2's SYN dropped for another reason" if drops and drops[0].event.drop_reason != DropReason.POLICY else \
            "b2's SYN dropped nowhere" if not drops else f"node-b holding {rows or 'no'} rows of it"
        return unhealthy(DENIED, saw, step)
    live_hook = drops[0].hook.label
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome(False, f"expected a pair ('hook', [row kinds]), got {answer!r}.")
    got_hook, got_rows = hook_name(answer[0]), kinds_answer(answer[1])
    if got_rows is None:
        return Outcome(False, f"expected a list of row kinds such as ['TCP IN'] second, got {answer[1]!r}.")
    rows_out = compare_rows(sorted(rows), sorted(got_rows), "node-b's rows")
    hook_ok = got_hook == live_hook
    diff = (("=" if hook_ok else "-", live_hook, got_hook), *rows_out.diff)
    if hook_ok and rows_out.passed:
        return Outcome(True, f"b1's {live_hook} dropped every SYN (Policy denied, ct=new: b2's identity is not in "
                             "b1's map). b2 is selected by no policy, so its from-container let the SYN out and "
                             "created the OUT row; the dropping hook returns before ct_create4, so node-b has no IN "
                             "row, and the retransmitted SYNs find the OUT row (ct=established at from-container).",
                       diff)
    problems = []
    if not hook_ok:
        if got_hook == "from-container":
            problems.append("b2's own hook let its SYN out: no policy selects b2, so its egress is not enforced")
        else:
            problems.append(f"{answer[0]!r} is not where the SYN was dropped: find the line that says DROPPED")
    if not rows_out.passed:
        if "TCP IN" in got_rows:
            problems.append("a hook creates its row only after its policy check allowed the packet: a dropped SYN "
                            "leaves no IN row")
        elif not got_rows:
            problems.append("the SYN did pass one hook before it was dropped, and that hook tracked it")
        else:
            problems.append(rows_out.message.rstrip("."))
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=f"('{live_hook}', {sorted(rows)})")


# -- 10.3 ---------------------------------------------------------------------------------
@exercise(
    "10.3",
    "Established, reply, and the policy map",
    hints=(
        "Two sends on one connection: read the `ct=` of the DROPPED line in the second, and of the lines at "
        "node-a's to-container (into a1) in the first.",
        "The CT result is printed as ct=<state>/<direction> on every line that did a lookup.",
        "The answer is ('established', 'reply'): v1.16 checks ESTABLISHED packets against the map and skips "
        "REPLY ones.",
    ),
    fault="no-tunnel",
    cells=(ESTAB,),
)
def established_vs_reply(answer, ev) -> Outcome:
    """(CT state of the data packet b1's to-container dropped after the allow went, CT state of b1's answers
    that passed a1's deny-all ingress before), from section 3's two sends on one connection."""
    sends = ev.steps(op="tcp-send", actor="a1", target="b1", port=8080, **_CLEAN)
    if not sends:
        return Outcome.needs(ESTAB, "conn.send() before and after the policy change records both")
    last = sends[-1]
    first = next((s for s in sends if s.attrs["conn"] == last.attrs["conn"] and s.ok), None)
    sport = last.attrs.get("sport")
    drops = [f for f in last.flows if f.dropped and f.node == "node-b" and src(f.event.before)[1] == sport]
    a1 = ev.topology.pod("a1").ip
    answers = [] if first is None else [
        f for f in first.flows if f.node == "node-a" and f.hook == Hook.TO_CONTAINER and not f.dropped
        and dst(f.event.before) == (a1, sport)]
    if last.ok or first is None or not drops or not answers or drops[0].event.drop_reason != DropReason.POLICY:
        saw = ("the second send answered" if last.ok else
               "no send answered before the change" if first is None else
               "no drop of the second send at node-b" if not drops else
               "b1's answers not reaching a1" if not answers else "the second send dropped for another reason")
        return unhealthy(ESTAB, saw, last)
    live = (drops[0].ct_result.name.lower(), answers[0].ct_result.name.lower())
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome(False, f"expected a pair ('CT state', 'CT state'), got {answer!r}.")
    got = (_ct_name(answer[0]), _ct_name(answer[1]))
    diff = tuple(("=" if g == want else "-", want, g) for want, g in zip(live, got))
    if got == live:
        return Outcome(True, "the open connection stopped: its data packet is ct=established at b1's to-container, "
                             "and Cilium v1.16 checks established packets against the current map (ipv4_policy), so "
                             "once the allow was gone it was Policy denied. b1's answers into a1 were ct=reply, and "
                             "return traffic skips policy: a1's deny-all ingress never looked at them, and had no "
                             "need to allow b1.", diff)
    problems = []
    if got[0] != live[0]:
        if got[0] == "new":
            problems.append("the dropped packet belongs to an open connection: its IN row was still there, so the "
                            "lookup did not say new; conntrack does not shield an open connection from policy")
        else:
            problems.append(f"{answer[0]!r} is not the state b1's to-container gave the dropped packet: read its ct=")
    if got[1] != live[1]:
        if got[1] == "established":
            problems.append("the answers travel the connection backwards: at a1's side they match a1's OUT row the "
                            "other way round, and an established packet would have been checked by a1's deny-all")
        else:
            problems.append(f"{answer[1]!r} is not the state b1's answers had at a1's to-container: read its ct=")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=f"{live}")


# -- 10.4 ---------------------------------------------------------------------------------
@exercise(
    "10.4",
    "The egress verdict behind a Service",
    hints=(
        "Read the line of a1's SYN at node-a's from-container: it shows the packet before and after `=>`, and "
        "the verdict with `(ID:…)`.",
        "The verdict was taken after the Service lookup: whose identity is that ID (lab.pod(name).identity), and "
        "which port does the SYN carry after `=>`?",
        "The answer is (lab.pod('b1').identity, 8080): the backend's identity and port, after DNAT.",
    ),
    fault="skip-rev-nat",
    cells=(SVC,),
)
def service_egress(answer, ev) -> Outcome:
    """(remote identity, destination port) of a1's egress verdict on its SYN to the Service web, from section
    4's open."""
    step = ev.step(op="tcp-open", actor="a1", target="web", port=80, **_CLEAN)
    if step is None:
        return Outcome.needs(SVC, "a1's connection to web records its egress verdict")
    syns = [f for f in _verdicts(step, "node-a", Hook.FROM_CONTAINER, step.attrs.get("sport"))
            if is_syn(f.event.before) and f.policy.egress]
    if not step.ok or not syns or syns[0].policy.denied or not syns[0].translated:
        saw = "no egress verdict on a1's SYN" if not syns else \
            f"a1's SYN {'denied' if syns[0].policy.denied else 'allowed'} at from-container"
        return unhealthy(SVC, f"{saw}, and connect() {'succeeding' if step.ok else 'failing'}", step)
    ident, port = syns[0].event.remote_id, dst(syns[0].event.after)[1]
    if not isinstance(answer, (tuple, list)) or len(answer) != 2 or not all(
            isinstance(a, int) and not isinstance(a, bool) for a in answer):
        return Outcome(False, f"expected a pair (identity number, port number), got {answer!r}.")
    got_id, got_port = answer
    diff = (("=" if got_id == ident else "-", str(ident), str(got_id)),
            ("=" if got_port == port else "-", str(port), str(got_port)))
    owners = _pods_with(ev, ident)
    if (got_id, got_port) == (ident, port):
        return Outcome(True, f"identity {ident} ({', '.join(owners)}) and port {port}: from-container picked the "
                             "backend first, then looked a1's egress map up with the rewritten destination. A policy "
                             "never sees the VIP: allowing app=b1 on 8080 is what lets a1 use web:80.", diff)
    problems = []
    if got_id != ident:
        if got_id == 2:
            problems.append("the VIP is not the world: the verdict did not look the VIP up at all")
        else:
            problems.append(f"identity {got_id} is not the one on the SYN's verdict line: compare its ID with "
                            "lab.pod(name).identity")
    if got_port != port:
        if got_port == 80:
            problems.append("80 is the Service's port; the verdict was taken on the packet after `=>`")
        else:
            problems.append(f"port {got_port} is not the SYN's destination port after `=>`")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=f"({ident}, {port})")


# -- 10.5 ---------------------------------------------------------------------------------
_FLAG_NAMES = {n.lower(): n for n in CtFlags.names(sum(CtFlags))}  #: 'lbloopback' -> 'LBLoopback', ...


@exercise(
    "10.5",
    "A hairpin through a deny-all",
    hints=(
        "Read the line of the SYN at node-a's to-container in the open to self: its source, its ct= and its flags.",
        "Compare it with a2's SYN to a1 in the same cell, which a1's map refused: what does the hairpin SYN carry "
        "that a2's does not?",
        "The answer is ('new', 'LBLoopback'): a new SYN, from the loopback address, of a flow marked LBLoopback: "
        "ipv4_policy lets it in without asking the map.",
    ),
    fault="no-loopback-snat",
    cells=(HAIRPIN,),
)
def hairpin_skips_policy(answer, ev) -> Outcome:
    """(CT state of the hairpin SYN at a1's to-container, the CT flag it carried), from section 5's open of a1 ->
    self, graded only when the same section's a2 -> a1 SYN shows a1 denying all ingress."""
    step = ev.step(op="tcp-open", actor="a1", target="self", port=80, **_CLEAN)
    if step is None:
        return Outcome.needs(HAIRPIN, "a1's connection to self records the hairpin's trace")
    control = [s for s in ev.steps(op="tcp-open", actor="a2", target="a1", port=8080, **_CLEAN)]
    a1 = ev.topology.pod("a1").ip
    refused = control and not control[-1].ok and any(
        f.dropped and f.event.drop_reason == DropReason.POLICY and f.hook == Hook.TO_CONTAINER for f in control[-1].flows)
    syns = [f for f in step.flows if f.node == "node-a" and f.hook == Hook.TO_CONTAINER and is_syn(f.event.before)
            and dst(f.event.before) == (a1, 8080) and src(f.event.before)[1] == step.attrs.get("sport")]
    if not refused or not step.ok or not syns or syns[0].dropped or syns[0].policy is not None \
            or src(syns[0].event.before)[0] != LOOPBACK_SNAT_ADDR:
        saw = ("a2's connection to a1 not refused by a1's policy" if not refused else
               "no hairpin SYN delivered into a1" if not syns else
               f"the hairpin SYN arriving from {src(syns[0].event.before)[0]}"
               f"{' with a verdict' if syns[0].policy is not None else ''}, connect() "
               f"{'succeeding' if step.ok else 'failing'}")
        return unhealthy(HAIRPIN, saw, step)
    live_flags = CtFlags.names(syns[0].event.ct_flags)
    live = (syns[0].ct_result.name.lower(), "LBLoopback" if "LBLoopback" in live_flags else ",".join(live_flags))
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome(False, f"expected a pair ('CT state', 'flag'), got {answer!r}.")
    flag = str(answer[1]).strip().strip("[]").replace("_", "").lower()
    got = (_ct_name(answer[0]), _FLAG_NAMES.get(flag, str(answer[1]).strip()))
    diff = tuple(("=" if g == want else "-", want, g) for want, g in zip(live, got))
    if got == live:
        return Outcome(True, f"the SYN entered a1 as ct={live[0]}, from {LOOPBACK_SNAT_ADDR}, flagged {live[1]}: "
                             "a new packet that policy would check, but Cilium's ipv4_policy lets a new packet from "
                             "the service loopback address through when its flow's OUT row is a loopback one, and the "
                             "IN row it creates carries the flag, so the rest of the connection passes too. a2, with "
                             "the same labels as a1, was refused in the same cell: the exception is the hairpin's "
                             "alone.", diff)
    problems = []
    if got[0] != live[0]:
        if got[0] == "reply":
            problems.append("the SYN coming back into a1 is not a reply: it is the first packet a1's server sees of "
                            "a flow from the loopback address, and a reply would skip policy anyway")
        elif got[0] == "established":
            problems.append("a1's OUT row of the flow does not make the returning SYN established at to-container: "
                            "read its ct=")
        else:
            problems.append(f"{answer[0]!r} is not the SYN's ct= at a1's to-container")
    if got[1] != live[1]:
        problems.append(f"{answer[1]!r} is not the flag that marks the flow as a hairpin on that line")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=f"{live}")


# -- 10.6 (break it) ----------------------------------------------------------------------
@exercise(
    "10.6",
    "Break it: an answer that looks new",
    hints=(
        "Find the DROPPED line of the step: on which hook, and what does its ct= say?",
        "a1's from-container let the SYN out with a verdict; compare node-a's rows after the step with "
        "section 3's.",
        "The answer is ('to-container', 'new'): with no OUT row b1's SYN|ACK is new to a1's to-container, and a1 "
        "denies all ingress.",
    ),
    break_it=True,
    cells=(BREAK,),
)
def reply_seen_as_new(answer, ev) -> Outcome:
    """With no-out-entry on: (hook that dropped the connection's packet, the CT state it saw there), from the
    break-it cell's open of a1 -> b1."""
    step, missing = broken_step(ev, _FAULT, BREAK, "it switches the fault on, then opens a1 -> b1",
                                op="tcp-open", actor="a1", target="b1", port=8080)
    if missing:
        return missing
    sport = step.attrs.get("sport")
    drops = [f for f in step.flows if f.dropped and f.node == "node-a" and dst(f.event.before)[1] == sport
             and is_syn(f.event.before, ack=True)]
    if step.ok or not drops or drops[0].event.drop_reason != DropReason.POLICY:
        saw = "a1's connection to b1 opening" if step.ok else "no SYN|ACK dropped at node-a for Policy denied"
        return unhealthy(BREAK, saw, step)
    live = (drops[0].hook.label, drops[0].ct_result.name.lower())
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome(False, f"expected a pair ('hook', 'CT state'), got {answer!r}.")
    got = (hook_name(answer[0]), _ct_name(answer[1]))
    diff = tuple(("=" if g == want else "-", want, g) for want, g in zip(live, got))
    if got == live:
        return Outcome(True, f"a1's {live[0]} dropped b1's SYN|ACK as ct={live[1]}: from-container created no OUT "
                             "row for a1's SYN, so the answer matched nothing and looked like a new connection "
                             "from b1, which a1's deny-all ingress refuses (Policy denied). Replies pass policy "
                             "only because conntrack recognises them.", diff)
    problems = []
    if got[0] != live[0]:
        if got[0] == "from-container":
            problems.append("a1's SYN left: a1's policy only selects its ingress, so its egress is not enforced "
                            "(and reports no verdict)")
        else:
            problems.append(f"{answer[0]!r} is not the hook that dropped the packet: find the DROPPED line")
    if got[1] != live[1]:
        if got[1] == "reply":
            problems.append("a reply skips policy: had the hook seen ct=reply it would not have asked a1's map")
        else:
            problems.append(f"{answer[1]!r} is not the ct= on the DROPPED line")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=f"{live}")
