"""DNS lookups from a pod, made and kept as evidence by the lab (labkitd's ``fqdn.resolve``), and the agent's DNS
cache (``labkit fqdn cache list``). What a lookup keeps is :class:`labkit.fqdn.lookup.Lookup`.

    >>> web = resolve(lab, "a1", "web.lab.example")    # doctest: +SKIP
    >>> web.rcode_name, web.ips                        # doctest: +SKIP
    ('NOERROR', ['198.51.100.101'])
"""
from __future__ import annotations

import time

from labkit.errors import LabTimeoutError
from labkit.fqdn import dns
from labkit.fqdn.lookup import DONE_EVENTS, Lookup
from labkit.fqdn.zone import DNS_PORT, resolver
from labkit.maps.policy import Direction
from labkit.observe.evidence import JOURNAL
from labkit.policy.matchpattern import fqdn

__all__ = ["resolve", "cache_list", "wait_expired", "lab_ipcache"]

_ids = iter(range(0x1100, 0x10000))


def _events(lab, src: str, name: str, timeout: float) -> list[dict]:
    """The proxy's events for the query from ``src`` (``ip:port``) for ``name``, once it is done with it (and,
    for an answer, once the maps were written or the wait gave up); [] when the proxy never saw the query."""
    client = _agent(lab)
    deadline = time.monotonic() + timeout
    while True:
        log = client.get("/v1/fqdn/events")["events"]
        qid = max((e["query"] for e in log if e["event"] == "query" and e.get("src") == src
                   and e.get("name") == name), default=None)
        mine = [e for e in log if e["query"] == qid] if qid is not None else []
        kinds = {e["event"] for e in mine}
        done = bool(kinds & set(DONE_EVENTS)) and ("answer" not in kinds or "maps-written" in kinds
                                             or not any(e.get("records") for e in mine))
        if done or (qid is None and time.monotonic() > deadline - timeout / 2):
            return mine
        if time.monotonic() > deadline:
            raise LabTimeoutError(f"lookup of {name} from {src}: the DNS proxy logged {sorted(kinds)} after "
                                  f"{timeout} s; expected it to release or refuse the answer")
        time.sleep(0.02)


def _agent(lab):
    return lab.services.client


def cache_list(lab) -> list[str]:
    """The agent's DNS cache now, in ``cilium-dbg fqdn cache list`` grammar (``labkit fqdn cache list``)."""
    return _agent(lab).get("/v1/fqdn/cache")["lines"]


def wait_expired(lab, timeout: float = 10.0) -> list[str]:
    """Wait until the agent's DNS cache is empty (the answers' TTLs ran out on the lab clock and the agent took
    their addresses out of the maps); returns the cache list then."""
    deadline = time.monotonic() + timeout
    while True:
        got = _agent(lab).get("/v1/fqdn/cache")
        if not got["entries"]:
            return got["lines"]
        if time.monotonic() > deadline:
            raise LabTimeoutError(f"lab '{lab.name}': the DNS cache still holds {len(got['entries'])} answers after "
                                  f"{timeout} s at lab clock {got['now']}; expected every TTL to have run out")
        time.sleep(0.05)


def resolve(lab, pod: str, name: str, timeout: float = 5.0) -> Lookup:
    """Ask the lab's resolver for ``name``'s A records from ``pod``; the :class:`Lookup`, recorded as evidence
    (kind ``snapshot``, ``op="dns"``, ``actor=pod``, ``name``).

        >>> resolve(lab, "a1", "db.lab.example").ips    # doctest: +SKIP
        ['198.51.100.103']
    """
    name = fqdn(name)
    qid = next(_ids)
    res = lab.podclient(pod).call({"op": "udp", "host": resolver(lab.topology), "port": DNS_PORT,
                                   "data": dns.build_query(qid, name).hex(), "timeout": 3})
    rcode, records = None, ()
    if res.get("ok") and res.get("reply"):
        msg = dns.parse(bytes.fromhex(res["reply"]))
        rcode, records = msg.rcode, tuple((ip, ttl) for ip, ttl in msg.a_records())
    src = f"{lab.pod(pod).ip}:{res.get('sport')}"
    events = tuple(_events(lab, src, name, timeout))
    node = lab.topology.pod(pod).node
    ipc = lab_ipcache(lab, node)
    egress: dict[int, list[str]] = {}
    try:
        rows = lab.policy.get(pod).rows
    except Exception:  # a pod no policy selects has no map to read
        rows = []
    for r in rows:
        if r.key.direction == Direction.EGRESS:
            egress.setdefault(r.key.sec_label, []).append(r.key.port_proto())
    idents = {ip: ipc[ip] for ip, _ in records if ip in ipc}
    labels = {int(k): v for k, v in _agent(lab).get("/v1/identity")["identities"].items()
              if int(k) in idents.values()}
    look = Lookup(pod, name, res.get("sport"), rcode, records, events, idents, egress, labels, lab.clock.now(),
                  tuple(lab.faults()))
    JOURNAL.record(lab.name, "snapshot", f"dns {pod} {name}", look, op="dns", actor=pod, name=name,
                   faults=look.faults)
    return look


def lab_ipcache(lab, node: str) -> dict[str, int]:
    """``node``'s ipcache host entries: address -> identity."""
    from labkit.maps.base import PinnedMap
    from labkit.maps.eps import IpcacheKey, RemoteEndpointInfo

    with PinnedMap(f"{lab.pin_dir(node)}/cilium_ipcache", IpcacheKey, RemoteEndpointInfo) as m:
        return {str(k).split("/")[0]: v.sec_identity for k, v in m.items() if str(k).endswith("/32")}
