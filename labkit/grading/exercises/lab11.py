"""Lab 11, toFQDNs: the chain from a pod's DNS lookup to its policy map, a resolved name that no selector picks
and an allowed name nobody resolved, what ``*`` in matchPattern matches, an answer whose TTL ran out, and a
break-it fault that leaves the learnt identity without a policy key.

Graders read what the notebook's cells recorded: each lookup (:mod:`labkit.fqdn.lookup`: the pod's answer, the
DNS proxy's events for that query, the ipcache identities and the pod's egress keys just after it) and each
connection's step (its trace records carry the egress verdict: remote identity, drop reason). The rules the
answers follow are Cilium v1.16's:

- daemon/cmd/fqdn.go ``notifyOnDNSMsg``: the proxy hands an allowed answer's IPs to the name manager, which
  allocates the identities of the selectors that pick the name, writes the ipcache and waits for the endpoints'
  policy maps; only then (or when --tofqdns-proxy-response-max-delay, 100 ms, runs out) the answer goes back
  to the pod;
- pkg/policy/api/fqdn.go (``FQDNSelector``): a toFQDNs rule selects the IPs DNS answers gave for names it
  picks; any other address outside the cluster is ``reserved:world`` (pkg/identity numericidentity.go
  ``ReservedIdentityWorld`` = 2), which the rule does not allow; bpf/lib/policy.h ``__policy_can_access``
  finds no key and the egress hook (bpf_lxc.c ``handle_ipv4_from_lxc``) drops with DROP_POLICY;
- pkg/fqdn/matchpattern ``ToAnchoredRegexp``: ``*`` inside a pattern is ``[-a-zA-Z0-9_]*``, never a dot;
  pkg/fqdn/dnsproxy proxy.go ``ServeDNS``: a name the DNS rules do not allow is answered REFUSED by the proxy;
- pkg/fqdn/cache.go: an answer lives max(TTL, --tofqdns-min-ttl = 0) seconds; the name manager's GC
  (pkg/fqdn/namemanager/gc.go) then takes its IPs out of the ipcache and the selectors.

(tests/datapath/test_fqdn.py pins the same chain on the real kernel.)
"""
from __future__ import annotations

from typing import Any

from labkit.constants import DropReason, Hook
from labkit.fqdn.zone import DEFAULT_TTL, RECORDS
from labkit.grading.checks import Outcome, compare_rows, exercise
from labkit.grading.exercises.common import broken_step, hook_name, is_syn, src, unhealthy
from labkit.policy.matchpattern import fqdn

CHAIN, DENIED, PATTERN, TTL, BREAK = (
    "1. The chain, step by step", "2. Resolved is not allowed", "3. What `*` matches", "4. When the TTL runs out",
    "5. Break it")
_FAULT = "fqdn-no-policy-key"  #: section 5's fault, left out of the evidence of sections 1-4
_CLEAN = {"faults": lambda f: _FAULT not in f}
WEB, API, DB = RECORDS["web.lab.example"], RECORDS["api.lab.example"], RECORDS["db.lab.example"]
WORLD = 2  #: pkg/identity numericidentity.go ReservedIdentityWorld
PATTERN_NAMES = ("web.lab.example", "api.lab.example", "deep.web.lab.example", "lab.example")


def _lookups(ev, name: str, **attrs) -> list:
    """Records of a1's lookups of ``name`` (oldest first)."""
    return ev.records("snapshot", op="dns", actor="a1", name=fqdn(name), **attrs)


def _syn_verdicts(step) -> list:
    """The step's records of a1's SYNs at node-a's from-container that carry a policy verdict."""
    sport = step.attrs.get("sport")
    return [f for f in step.flows if f.node == "node-a" and f.hook == Hook.FROM_CONTAINER and f.policy is not None
            and is_syn(f.event.before) and src(f.event.before)[1] == sport]


def _denied_syn(step):
    """The first SYN of ``step`` dropped at from-container for Policy denied, or None."""
    return next((f for f in _syn_verdicts(step) if f.dropped and f.event.drop_reason == DropReason.POLICY), None)


def _same_identity(answer: Any, ident: int, labels: list[str]) -> bool:
    """The learner named ``ident``: by its number, or by one of its labels that tells it apart (world: the
    ``reserved:world`` label; an FQDN identity: its ``fqdn:`` label)."""
    if isinstance(answer, int) and not isinstance(answer, bool):
        return answer == ident
    text = str(answer).strip().lower()
    if ident == WORLD:
        return text in ("reserved:world", "world")
    return any(text == lab.lower() for lab in labels if lab.startswith("fqdn:"))


def _identity_text(ident: int, labels: list[str]) -> str:
    if ident == WORLD:
        return "reserved:world"
    return next((lab for lab in labels if lab.startswith("fqdn:")), str(ident))


def _says_fqdn(answer: Any) -> bool:
    return str(answer).strip().lower().startswith("fqdn:")


def _says_world(answer: Any) -> bool:
    return answer == WORLD or str(answer).strip().lower() in ("reserved:world", "world")


# -- 11.1 ---------------------------------------------------------------------------------
@exercise(
    "11.1",
    "The chain: maps first, answer second",
    hints=(
        "Read the lookup's event lines: the times are milliseconds from the moment the proxy got the query.",
        "Compare the times of `maps-written` and `released`, then read the identity the line under them gives "
        "web's address and the labels in brackets.",
        "The answer is ('maps-written', 'fqdn:web.lab.example'): the proxy held the answer until a1's map had a "
        "key for the identity labelled by web's selector.",
    ),
    fault="dns-release-early",
    cells=(CHAIN,),
)
def chain(answer, ev) -> Outcome:
    """(the event that came first of maps-written and released, the identity web's address got), from a1's
    lookup of web.lab.example."""
    recs = _lookups(ev, "web.lab.example", **_CLEAN)
    if not recs:
        return Outcome.needs(CHAIN, "a1's lookup of web.lab.example records what the proxy did")
    look = recs[-1].data
    names = look.event_names
    if look.rcode != 0 or look.ip != WEB or "query" not in names or "max-delay" in names \
            or not {"maps-written", "released"} <= set(names) or look.identity is None:
        saw = ("no proxy event for a1's query (it did not pass the DNS proxy)" if "query" not in names else
               f"the answer {look.rcode_name} {look.ips}" if look.rcode != 0 or look.ip != WEB else
               "the proxy giving up its wait (max-delay): the machine was too slow" if "max-delay" in names else
               f"the proxy's events {names}" if not {"maps-written", "released"} <= set(names) else
               "web's address without an identity in the ipcache")
        return unhealthy(CHAIN, saw, look)
    first = min(("maps-written", "released"), key=names.index)
    ident, labels = look.identity, look.labels.get(look.identity, [])
    live = (first, _identity_text(ident, labels))
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome(False, f"expected a pair ('event', identity), got {answer!r}.")
    got_first = str(answer[0]).strip().lower()
    first_ok, id_ok = got_first == first, _same_identity(answer[1], ident, labels)
    diff = (("=" if first_ok else "-", first, got_first), ("=" if id_ok else "-", live[1], str(answer[1])))
    if first_ok and id_ok:
        return Outcome(True, f"the proxy wrote the maps first and released the answer after them "
                             f"({look.events[-1].get('held_ms')} ms held): web's address got identity {ident} "
                             f"{labels}, a key for it on 8080/TCP went into a1's map, and only then did a1 see the "
                             "address, so its first SYN already finds the key.", diff)
    problems = []
    if not first_ok:
        if got_first == "released":
            problems.append("the proxy does not answer first and learn in the background: read the two events' "
                            "times")
        else:
            problems.append(f"{answer[0]!r} is not one of the two events asked about: 'maps-written' or "
                            "'released'")
    if not id_ok:
        if _says_world(answer[1]):
            problems.append("world is what the address was before the answer: after it, the ipcache gives it an "
                            "identity of the selector that picked the name")
        elif str(answer[1]).strip().lower().startswith("cidr:"):
            problems.append("toFQDNs does not make a CIDR identity per address: the identity is labelled by the "
                            "selector that picked the name")
        else:
            problems.append(f"{answer[1]!r} is not the identity the ipcache gave web's address: read the line "
                            "under the events")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=f"{live}")


# -- 11.2 ---------------------------------------------------------------------------------
@exercise(
    "11.2",
    "Resolved is not allowed, allowed is not resolved",
    hints=(
        "Read the DROPPED lines of the connections to db and to api: the hook and the `(ID:…)` of the verdict.",
        "db's lookup printed its address with no identity; api was never looked up at all. What is any address "
        "outside the cluster that the ipcache does not know?",
        "The answer is ('from-container', 'reserved:world'): both SYNs were denied by a1's egress as world (ID 2).",
    ),
    fault=_FAULT,
    cells=(DENIED,),
)
def resolved_not_allowed(answer, ev) -> Outcome:
    """(hook that dropped a1's SYNs to db's and to api's addresses, the identity their verdicts named), graded
    when the same cell's connection to web's resolved address opened."""
    to_db = ev.records("step", op="tcp-open", actor="a1", target=DB, **_CLEAN)
    if not to_db:
        return Outcome.needs(DENIED, "a1's connections to web, db and api record their verdicts")
    db_rec = to_db[-1]
    webs = [r for r in ev.records("step", op="tcp-open", actor="a1", target=WEB, **_CLEAN) if r.seq < db_rec.seq]
    apis = ev.after(db_rec, "step", op="tcp-open", actor="a1", target=API, **_CLEAN)
    looks = [r for r in _lookups(ev, "db.lab.example", **_CLEAN) if r.seq < db_rec.seq]
    if not webs or not apis or not looks:
        return Outcome.needs(DENIED, "it looks web and db up, then connects to web, db and api")
    web, db, api, db_look = webs[-1].data, db_rec.data, apis[0].data, looks[-1].data
    drops = [_denied_syn(db), _denied_syn(api)]
    if not web.ok or db.ok or api.ok or None in drops or db_look.ip != DB:
        saw = ("a1's connection to web's resolved address failing" if not web.ok else
               "a connection to db or api opening" if db.ok or api.ok else
               "no SYN to db or api dropped at a1's from-container for Policy denied" if None in drops else
               f"db answered {db_look.rcode_name} {db_look.ips}")
        return unhealthy(DENIED, saw, db)
    if drops[0].event.remote_id != drops[1].event.remote_id:
        return unhealthy(DENIED, f"db's and api's verdicts naming identities {drops[0].event.remote_id} and "
                                 f"{drops[1].event.remote_id}", db)
    ident = drops[0].event.remote_id
    live = (drops[0].hook.label, _identity_text(ident, []))
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome(False, f"expected a pair ('hook', identity), got {answer!r}.")
    got_hook = hook_name(answer[0])
    hook_ok, id_ok = got_hook == live[0], _same_identity(answer[1], ident, [])
    diff = (("=" if hook_ok else "-", live[0], got_hook), ("=" if id_ok else "-", live[1], str(answer[1])))
    if hook_ok and id_ok:
        return Outcome(True, f"a1's {live[0]} denied both SYNs as {live[1]} (ID:{ident}): db went through the DNS "
                             "rule, but no toFQDNs selector picks db, so its address got no identity; api's "
                             "selector would, but nobody asked for api, so its address was never learnt. A toFQDNs "
                             "rule allows only addresses an answer gave for a name it selects.", diff)
    problems = []
    if not hook_ok:
        if got_hook in ("to-netdev", "from-netdev"):
            problems.append("the node's netdev enforces no pod's policy: a1's egress is checked where a1's packets "
                            "enter the datapath")
        else:
            problems.append(f"{answer[0]!r} is not the hook on the DROPPED lines")
    if not id_ok:
        if _says_fqdn(answer[1]):
            problems.append("db's address got no identity of its own: no toFQDNs selector picks db, and the DNS "
                            "rule only lets the question through")
        else:
            problems.append(f"{answer[1]!r} is not the identity on the verdicts (the `ID:`)")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=f"{live}")


# -- 11.3 ---------------------------------------------------------------------------------
@exercise(
    "11.3",
    "What * matches",
    hints=(
        "Each lookup's first line says what came back; a refused one also has a `refused` event from the proxy.",
        "The DNS rule is matchPattern '*.lab.example'. In Cilium's patterns `*` stands for letters, digits, '-' "
        "and '_' only: which names can it then match?",
        "The answer is ['deep.web.lab.example', 'lab.example']: `*` never crosses a dot, and the dot before "
        "'lab.example' is part of the pattern.",
    ),
    fault="dns-star-crosses-dots",
    cells=(PATTERN,),
)
def star_pattern(answer, ev) -> Outcome:
    """The names of section 3's four lookups that the DNS proxy refused (its own REFUSED, never forwarded)."""
    looks = {}
    for name in PATTERN_NAMES:
        recs = _lookups(ev, name, **_CLEAN)
        if not recs:
            return Outcome.needs(PATTERN, "a1 looks up four names through the DNS proxy")
        looks[name] = recs[-1].data
    if any("query" not in look.event_names for look in looks.values()):
        return unhealthy(PATTERN, "a lookup that never reached the DNS proxy", next(iter(looks.values())))
    refused = sorted(n for n, look in looks.items() if "refused" in look.event_names and look.rcode == 5)
    if isinstance(answer, str):
        answer = answer.replace(",", " ").split()
    if not isinstance(answer, (list, tuple, set)):
        return Outcome(False, f"expected a list of names such as ['web.lab.example'], got {answer!r}.")
    got = sorted({fqdn(str(a)).rstrip(".") for a in answer})
    out = compare_rows(refused, got, "names the proxy refused")
    if out.passed:
        return Outcome(True, "deep.web.lab.example and lab.example were REFUSED by the proxy itself: the pattern "
                             "becomes ^[-a-zA-Z0-9_]*[.]lab[.]example[.]$, so `*` fills one label and never a dot, "
                             "and the dot after it is required. To allow every depth a policy needs more patterns "
                             "('*.*.lab.example', ...) or '*' alone.", out.diff)
    have = set(got)
    if have == {"deep.web.lab.example"}:
        msg = "`*` may stand for nothing, but the pattern's own dot before 'lab' stays: 'lab.example' has none."
    elif have == {"lab.example"}:
        msg = "in Cilium's patterns `*` is not a shell glob: it matches letters, digits, '-' and '_', never a dot."
    elif not have:
        msg = "the proxy refused some of the four names: look for lookups whose answer says REFUSED."
    else:
        msg = out.message
    return Outcome(False, msg, out.diff, reveal=out.reveal)


# -- 11.4 ---------------------------------------------------------------------------------
@exercise(
    "11.4",
    "When the TTL runs out",
    hints=(
        "The lookup prints the answer's TTL; the second connection's DROPPED line carries the verdict's `(ID:…)`.",
        "After the clock moved, the cache list was empty: what does the ipcache know of web's address now?",
        f"The answer is ({DEFAULT_TTL}, 'reserved:world'): past its TTL the answer leaves the cache, the address "
        "leaves the ipcache and is world again.",
    ),
    fault=_FAULT,
    cells=(TTL,),
)
def ttl_expiry(answer, ev) -> Outcome:
    """(the TTL of web's answer, the identity the verdict named on a1's new SYN to web's address once the lab
    clock had moved past it), from section 4's lookup and two connections."""
    steps = ev.records("step", op="tcp-open", actor="a1", target=WEB, **_CLEAN)
    after = next((r for r in reversed(steps) if not r.data.ok), None)
    if after is None:
        return Outcome.needs(TTL, "a1 connects to web's address before and after the clock moves")
    befores = [r for r in steps if r.seq < after.seq and r.data.ok]
    looks = [r for r in _lookups(ev, "web.lab.example", **_CLEAN) if befores and r.seq < befores[-1].seq]
    if not befores or not looks:
        return Outcome.needs(TTL, "it looks web up and connects before the clock moves")
    look, before, step = looks[-1].data, befores[-1].data, after.data
    drop = _denied_syn(step)
    ttl = min((t for _, t in look.records), default=None)
    if ttl is None or drop is None or step.now - look.now < ttl:
        saw = ("no answer for web" if ttl is None else
               "no SYN to web dropped at a1's from-container for Policy denied" if drop is None else
               f"the lab clock moving {step.now - look.now} s between the lookup and the second connection")
        return unhealthy(TTL, saw, step)
    ident = drop.event.remote_id
    live = (ttl, _identity_text(ident, []))
    if not isinstance(answer, (tuple, list)) or len(answer) != 2 or isinstance(answer[0], bool) \
            or not isinstance(answer[0], int):
        return Outcome(False, f"expected a pair (seconds, identity), got {answer!r}.")
    ttl_ok, id_ok = answer[0] == ttl, _same_identity(answer[1], ident, [])
    diff = (("=" if ttl_ok else "-", str(ttl), str(answer[0])), ("=" if id_ok else "-", live[1], str(answer[1])))
    if ttl_ok and id_ok:
        return Outcome(True, f"the answer lived {ttl} s on the lab clock (v1.16's --tofqdns-min-ttl is 0: the "
                             "server's TTL rules); then the agent took web's address out of the cache, the ipcache "
                             f"and a1's map, and the new SYN was {live[1]} again: denied until a1 asks DNS again. "
                             "(Cilium keeps the IPs of connections still open alive as 'zombies'; labkit does not "
                             "model them.)", diff)
    problems = []
    if not ttl_ok:
        if answer[0] in (3600, 60):
            problems.append("v1.16 keeps no answer longer than its TTL by default (--tofqdns-min-ttl is 0): read "
                            "the TTL the lookup printed")
        else:
            problems.append(f"{answer[0]!r} is not the TTL of web's answer")
    if not id_ok:
        if _says_fqdn(answer[1]):
            problems.append("the identity does not outlive the answer: once the TTL ran out the ipcache no longer "
                            "maps web's address to it")
        else:
            problems.append(f"{answer[1]!r} is not the identity on the second connection's verdict")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=f"{live}")


# -- 11.5 (break it) ----------------------------------------------------------------------
@exercise(
    "11.5",
    "Break it: an identity without a key",
    hints=(
        "Read the `(ID:…)` on the DROPPED line, and find that number in the lookup's last line.",
        "The lookup also prints a1's egress keys for that identity: compare with section 1's.",
        "The answer is ('fqdn:web.lab.example', []): the address has its FQDN identity, but a1's map holds no "
        "key for it.",
    ),
    break_it=True,
    cells=(BREAK,),
)
def identity_without_key(answer, ev) -> Outcome:
    """With fqdn-no-policy-key on: (the identity the verdict named on a1's dropped SYN to web, a1's egress keys
    for that identity after the lookup), from the break-it cell."""
    step, missing = broken_step(ev, _FAULT, BREAK, "it switches the fault on, looks web up and connects",
                                op="tcp-open", actor="a1", target=WEB)
    if missing:
        return missing
    looks = _lookups(ev, "web.lab.example", faults=lambda f: _FAULT in f)
    drop = _denied_syn(step)
    look = looks[-1].data if looks else None
    if look is None or drop is None or look.identity is None or drop.event.remote_id != look.identity:
        saw = ("no lookup of web with the fault on" if look is None else
               "no SYN to web dropped at a1's from-container for Policy denied" if drop is None else
               "web's address without an identity in the ipcache" if look.identity is None else
               f"the verdict naming ID {drop.event.remote_id} where the ipcache gave {look.identity}")
        return unhealthy(BREAK, saw, step)
    ident, labels = look.identity, look.labels.get(look.identity, [])
    keys = sorted(look.egress.get(ident, []))
    live = (_identity_text(ident, labels), keys)
    if not isinstance(answer, (tuple, list)) or len(answer) != 2 or not isinstance(answer[1], (list, tuple)):
        return Outcome(False, f"expected a pair (identity, [keys]), got {answer!r}.")
    got_keys = sorted(str(k).strip().upper() for k in answer[1])
    id_ok, keys_ok = _same_identity(answer[0], ident, labels), got_keys == keys
    diff = (("=" if id_ok else "-", live[0], str(answer[0])), ("=" if keys_ok else "-", str(keys), str(got_keys)))
    if id_ok and keys_ok:
        return Outcome(True, f"the verdict named {live[0]} (ID:{ident}): the ipcache had learnt web's address, so "
                             "the datapath knew who the peer was, but a1's map held no key for that identity, and "
                             "no key is Policy denied. The chain needs both writes: ipcache and policy map.", diff)
    problems = []
    if not id_ok:
        if _says_world(answer[0]):
            problems.append("the address was learnt: the verdict's ID is not world's 2")
        else:
            problems.append(f"{answer[0]!r} is not the identity on the DROPPED line")
    if not keys_ok:
        if "8080/TCP" in got_keys:
            problems.append("an identity in the ipcache allows nothing by itself: read a1's egress keys the lookup "
                            "printed")
        else:
            problems.append(f"{answer[1]!r} are not a1's egress keys for that identity")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=f"{live}")
