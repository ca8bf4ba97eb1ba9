"""kube-proxy's iptables mode, for comparison: the same Service objects as the
eBPF agent, turned into the ``nat`` table kube-proxy writes, and Linux
conntrack read back as rows.

A lab brought up with ``--service-mode iptables`` keeps its BPF programs for
pod-to-pod traffic (and their CT maps), but the agent writes no ``cilium_lb4_*``
entry: every Service lives in each node's ``nat`` table instead, as kube-proxy
lays it out::

    PREROUTING/OUTPUT -> KUBE-SERVICES -> KUBE-SVC-<hash>  (-m statistic --mode random, one rule per endpoint)
                                       -> KUBE-SEP-<hash>  (-s <endpoint> -j KUBE-MARK-MASQ, then DNAT)
    KUBE-SERVICES (last rule, local addresses) -> KUBE-NODEPORTS -> KUBE-EXT-<hash> (mark, then KUBE-SVC)
    POSTROUTING -> KUBE-POSTROUTING: marked packets are MASQUERADEd

Every change rewrites the whole table with ``iptables-restore`` (kube-proxy's
full sync), where the eBPF agent updates one map entry.

    >>> from labkit.topology import Topology
    >>> from labkit.services import Services
    >>> svcs = Services.in_memory(Topology.default("demo"))
    >>> web = svcs.add("web", 80, ["b1:8080", "b2:8080"])
    >>> text = nat_table(svcs.list(), Topology.default("demo"))
    >>> [l for l in text.splitlines() if "statistic" in l][0]  # doctest: +ELLIPSIS
    '-A KUBE-SVC-... -m comment --comment "default/web -> 198.18.2.11:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-...'
"""
from __future__ import annotations

import base64
import hashlib
import re
import subprocess
from dataclasses import dataclass
from typing import Iterable

from .topology import POD_SUPERNET, Topology

__all__ = ["SERVICE_MODES", "svc_chain", "ext_chain", "sep_chain", "nat_table", "ConntrackRow", "parse_conntrack",
           "MASQ_MARK"]

SERVICE_MODES = ("ebpf", "iptables")
MASQ_MARK = "0x4000/0x4000"  #: kube-proxy's --iptables-masquerade-bit 14


def _hash(text: str) -> str:
    """kube-proxy's portProtoHash: base32 of sha256, first 16 characters."""
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()[:16]


def _port_name(svc) -> str:
    return f"default/{svc.name}"


def svc_chain(svc) -> str:
    """``KUBE-SVC-<hash of service port name and protocol>``, as kube-proxy names it."""
    return "KUBE-SVC-" + _hash(_port_name(svc) + svc.protocol.lower())


def ext_chain(svc) -> str:
    """``KUBE-EXT-<same hash>``: the entry for NodePort and LoadBalancer traffic."""
    return "KUBE-EXT-" + _hash(_port_name(svc) + svc.protocol.lower())


def sep_chain(svc, endpoint: str) -> str:
    """``KUBE-SEP-<hash of port name, protocol and endpoint>``."""
    return "KUBE-SEP-" + _hash(_port_name(svc) + svc.protocol.lower() + endpoint)


def nat_table(services: Iterable, topology: Topology) -> str:
    """The whole ``nat`` table (iptables-restore input) kube-proxy would write for ``services``."""
    services = list(services)
    chains = ["KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ"]
    rules = [
        '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        '-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING',
        f"-A KUBE-MARK-MASQ -j MARK --set-xmark {MASQ_MARK}",
        f"-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK} -j RETURN",
        f"-A KUBE-POSTROUTING -j MARK --set-xmark {MASQ_MARK.split('/')[0]}/0x0",
        # kube-proxy adds --random-fully where iptables has it; labkit leaves it out, so a masqueraded flow keeps
        # its client port (when free) and a step can follow it by that port
        '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE',
    ]
    services_rules, nodeport_rules = [], []
    for svc in services:
        proto = svc.protocol.lower()
        name, chain, ext = _port_name(svc), svc_chain(svc), ext_chain(svc)
        active = [(b, f"{topology.pod(b.pod).ip}:{b.port}") for b in svc.backends if b.state == "active"]
        if not active:  # kube-proxy REJECTs in the filter table; here the packet finds no DNAT and goes nowhere
            continue
        chains.append(chain)
        services_rules.append(f'-A KUBE-SERVICES -d {svc.vip}/32 -p {proto} -m comment --comment "{name} cluster IP" '
                              f"-m {proto} --dport {svc.port} -j {chain}")
        rules.append(f'-A {chain} ! -s {POD_SUPERNET} -d {svc.vip}/32 -p {proto} -m comment --comment '
                     f'"{name} cluster IP" -m {proto} --dport {svc.port} -j KUBE-MARK-MASQ')
        for i, (b, endpoint) in enumerate(active):
            left = len(active) - i
            pick = f" -m statistic --mode random --probability {1 / left:.11f}" if left > 1 else ""
            rules.append(f'-A {chain} -m comment --comment "{name} -> {endpoint}"{pick} -j {sep_chain(svc, endpoint)}')
        for b, endpoint in active:
            sep = sep_chain(svc, endpoint)
            chains.append(sep)
            rules.append(f'-A {sep} -s {endpoint.split(":")[0]}/32 -m comment --comment "{name}" -j KUBE-MARK-MASQ')
            rules.append(f'-A {sep} -p {proto} -m comment --comment "{name}" -m {proto} -j DNAT '
                         f"--to-destination {endpoint}")
        if svc.type != "ClusterIP":
            chains.append(ext)
            rules.append(f'-A {ext} -m comment --comment "masquerade traffic for {name} external destinations" '
                         "-j KUBE-MARK-MASQ")
            rules.append(f"-A {ext} -j {chain}")
            nodeport_rules.append(f'-A KUBE-NODEPORTS -p {proto} -m comment --comment "{name}" -m {proto} '
                                  f"--dport {svc.node_port} -j {ext}")
            if svc.lb_vip:
                services_rules.append(f"-A KUBE-SERVICES -d {svc.lb_vip}/32 -p {proto} -m comment --comment "
                                      f'"{name} loadbalancer IP" -m {proto} --dport {svc.port} -j {ext}')
    services_rules.append('-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be '
                          'the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS')
    head = ["*nat", ":PREROUTING ACCEPT [0:0]", ":INPUT ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]",
            ":POSTROUTING ACCEPT [0:0]"] + [f":{c} - [0:0]" for c in chains]
    return "\n".join(head + rules + services_rules + nodeport_rules + ["COMMIT"]) + "\n"


def restore(netns: str, text: str) -> None:
    """``iptables-restore`` of a whole table inside namespace ``netns`` (replaces what was there)."""
    from . import _netns
    from .errors import DatapathError

    proc = subprocess.run(["iptables-restore", "-w"], input=text, text=True, capture_output=True,
                          preexec_fn=_netns.preexec(netns, None, new_session=False))
    if proc.returncode:
        raise DatapathError(f"iptables-restore in {netns} failed ({proc.returncode}): {proc.stderr.strip()}")


@dataclass(frozen=True)
class ConntrackRow:
    """One Linux conntrack entry (``conntrack -L``): the original tuple, the reply tuple, state and mark.

    >>> r = parse_conntrack("tcp      6 431999 ESTABLISHED src=198.18.1.11 dst=198.19.0.10 sport=40000 dport=80 "
    ...                     "src=198.18.2.11 dst=198.18.1.11 sport=8080 dport=40000 [ASSURED] mark=0 use=1")[0]
    >>> r.flow(), r.reply(), r.dnat
    ('198.18.1.11:40000 -> 198.19.0.10:80', '198.18.2.11:8080 -> 198.18.1.11:40000', True)
    """

    proto: str
    timeout: int
    state: str
    src: str
    dst: str
    sport: int
    dport: int
    reply_src: str
    reply_dst: str
    reply_sport: int
    reply_dport: int
    flags: tuple[str, ...]
    mark: int

    def flow(self) -> str:
        return f"{self.src}:{self.sport} -> {self.dst}:{self.dport}"

    def reply(self) -> str:
        return f"{self.reply_src}:{self.reply_sport} -> {self.reply_dst}:{self.reply_dport}"

    @property
    def dnat(self) -> bool:
        """The reply comes from someone other than the original destination: DNAT happened."""
        return (self.reply_src, self.reply_sport) != (self.dst, self.dport)

    @property
    def snat(self) -> bool:
        """The reply goes to someone other than the original source: SNAT (masquerade) happened."""
        return (self.reply_dst, self.reply_dport) != (self.src, self.sport)

    def line(self) -> str:
        nat = "".join(x for x, on in ((" DNAT", self.dnat), (" SNAT", self.snat)) if on)
        return (f"{self.proto.upper()} {self.state or '-'} {self.flow()} | reply {self.reply()}"
                f"{nat} timeout={self.timeout}s {' '.join(self.flags)}").rstrip()

    def __str__(self) -> str:
        return self.line()


_FIELD = re.compile(r"(src|dst|sport|dport|mark)=(\S+)")


def parse_conntrack(text: str) -> list[ConntrackRow]:
    """Rows of ``conntrack -L`` output (TCP and UDP; other protocols are skipped)."""
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[0] not in ("tcp", "udp"):
            continue
        proto, timeout = parts[0], int(parts[2])
        state = parts[3] if proto == "tcp" else ""
        fields = _FIELD.findall(line)
        addrs = [v for k, v in fields if k in ("src", "dst", "sport", "dport")]
        if len(addrs) < 8:
            continue
        mark = next((int(v, 0) for k, v in fields if k == "mark"), 0)
        flags = tuple(w.strip("[]") for w in parts if w.startswith("["))
        rows.append(ConntrackRow(proto, timeout, state, addrs[0], addrs[1], int(addrs[2]), int(addrs[3]),
                                 addrs[4], addrs[5], int(addrs[6]), int(addrs[7]), flags, mark))
    return rows
