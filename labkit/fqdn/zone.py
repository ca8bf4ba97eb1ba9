"""The lab zone ``lab.example``: a real DNS server (Debian's ``dnsmasq``) in the first external
client's namespace, and what the nodes need to hand pods' DNS to the agent's DNS proxy.

``labkit up`` with policy compiled in (``--policy-mode default|always``) calls :func:`start`:

- ext (``198.51.100.100``) gets the zone's addresses (``198.51.100.101``–``.104``, on its eth0:
  inside the underlay /24, so every node reaches them on-link) and routes back to every node's pod
  CIDR (pods' packets to the zone keep their pod source address: labkit does no masquerading);
- ext runs ``dnsmasq`` on ``198.51.100.100:53``, answering only for ``lab.example`` (``--local``:
  never forwarded, an unknown name is NXDOMAIN) with A records of a settable TTL, and a
  :mod:`labkit.net.podserver` on port 8080 (``pod=ext``), the service behind the names;
- every node gets Cilium's proxy routing: ``ip rule add fwmark 0x200/0xf00 lookup 2004 pref 9`` and
  ``ip route add local 0.0.0.0/0 dev lo table 2004`` (pkg/datapath/linux/route, linux_defaults
  RouteTableToProxy 2004, RulePriorityToProxyIngress 9, MagicMarkIsToProxy 0x200 under RouteMarkMask
  0xf00), so a packet the datapath marked for the proxy (bpf/lib/proxy.h) is delivered locally.

Both processes are in the ledger (``down`` stops them); the addresses, routes and rules live in
the lab's namespaces and go with them.

    >>> dnsmasq_argv("198.51.100.100", {"web.lab.example": "198.51.100.101"}, 30, "/tmp/x.log")[-2:]
    ['--host-record=web.lab.example,198.51.100.101,30', '--log-facility=/tmp/x.log']
"""
from __future__ import annotations

import shutil
import subprocess
import time
from typing import Mapping

from labkit.errors import LabStateError, LabTimeoutError
from labkit.net import netns as _netns
from labkit.net import pod_argv
from labkit.net.ledger import Ledger
from labkit.net.topology import Topology

__all__ = ["ZONE", "RECORDS", "DEFAULT_TTL", "DNS_PORT", "EXT_WEB_PORT", "PROXY_MARK", "PROXY_MARK_MASK",
           "PROXY_ROUTE_TABLE", "PROXY_RULE_PRIORITY", "dnsmasq_argv", "start", "restart_dns", "resolver"]

ZONE = "lab.example"  #: RFC 2606 reserves .example: these names never resolve outside the lab
#: The zone's A records: names → addresses ext owns (198.51.100.0/24, DESIGN.md §4).
RECORDS = {
    "web.lab.example": "198.51.100.101",
    "api.lab.example": "198.51.100.102",
    "db.lab.example": "198.51.100.103",
    "deep.web.lab.example": "198.51.100.104",
}
DEFAULT_TTL = 30  #: seconds; ``restart_dns(lab, ttl=…)`` sets another
DNS_PORT = 53
EXT_WEB_PORT = 8080
PROXY_MARK, PROXY_MARK_MASK = 0x0200, 0x0F00
PROXY_ROUTE_TABLE, PROXY_RULE_PRIORITY = 2004, 9


def resolver(topo: Topology) -> str:
    """The address pods send DNS to: the zone's server in the first external client."""
    if not topo.externals:
        raise LabStateError(f"lab '{topo.lab}': expected an external client to host the DNS zone, got none")
    return topo.externals[0].ip


def dnsmasq_argv(listen: str, records: Mapping[str, str], ttl: int, log: str) -> list[str]:
    """dnsmasq answering ``records`` (A, TTL ``ttl``) on ``listen``:53 only, nothing forwarded."""
    exe = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
    return [exe, "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--no-poll",
            "--bind-interfaces", f"--listen-address={listen}", f"--port={DNS_PORT}", "--pid-file=",
            "--user=root", "--log-queries", f"--local=/{ZONE}/",
            *[f"--host-record={name},{addr},{ttl}" for name, addr in records.items()], f"--log-facility={log}"]


def _ext_network(topo: Topology) -> None:
    from pyroute2 import IPRoute

    ext = topo.externals[0]
    with _netns.entered(topo.netns(ext.name)):
        ipr = IPRoute()
    try:
        eth0 = ipr.link_lookup(ifname="eth0")[0]
        for addr in RECORDS.values():
            ipr.addr("replace", index=eth0, address=addr, prefixlen=24)
        for n in topo.nodes:
            ipr.route("replace", dst=n.pod_cidr, gateway=n.ip, oif=eth0)
    finally:
        ipr.close()


def _node_proxy_routing(topo: Topology) -> None:
    from pyroute2 import IPRoute

    for n in topo.nodes:
        with _netns.entered(topo.netns(n.name)):
            ipr = IPRoute()
        try:
            lo = ipr.link_lookup(ifname="lo")[0]
            ipr.route("replace", dst="0.0.0.0/0", table=PROXY_ROUTE_TABLE, type="local", scope=254, oif=lo)
            if not [r for r in ipr.get_rules(family=2) if r.get_attr("FRA_PRIORITY") == PROXY_RULE_PRIORITY]:
                ipr.rule("add", table=PROXY_ROUTE_TABLE, priority=PROXY_RULE_PRIORITY, fwmark=PROXY_MARK,
                         fwmask=PROXY_MARK_MASK)
        finally:
            ipr.close()


def _start_dnsmasq(topo: Topology, ledger: Ledger, ttl: int) -> int:
    ext = topo.externals[0]
    log = ledger.dir / "dnsmasq.log"
    recorded = {e.get("path") for e in ledger.entries("file")}
    if str(log) not in recorded:
        ledger.record("file", path=str(log))
    start = log.stat().st_size if log.exists() else 0
    proc = subprocess.Popen(dnsmasq_argv(ext.ip, RECORDS, ttl, str(log)), preexec_fn=_netns.preexec(topo.netns(ext.name)),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(log, "ab"), close_fds=True)
    ledger.record_process("dnsmasq", proc.pid, netns=topo.netns(ext.name), ttl=ttl)
    deadline = time.monotonic() + 10
    while True:
        text = log.read_text(errors="replace")[start:] if log.exists() else ""
        if "started, version" in text:
            return proc.pid
        if proc.poll() is not None:
            raise LabStateError(f"ext '{ext.name}': dnsmasq exited ({proc.returncode}), expected it to serve {ZONE}: "
                                f"{log.read_text(errors='replace')[start:][-1000:]}")
        if time.monotonic() > deadline:
            raise LabTimeoutError(f"ext '{ext.name}': dnsmasq not started after 10 s (log {log})")
        time.sleep(0.02)


def start(topo: Topology, ledger: Ledger, ttl: int = DEFAULT_TTL) -> dict:
    """The zone in ext (addresses, routes, dnsmasq, the web server) and the nodes' proxy routing."""
    _ext_network(topo)
    _node_proxy_routing(topo)
    pid = _start_dnsmasq(topo, ledger, ttl)
    ext = topo.externals[0]
    logs = ledger.dir / "pods"
    log = logs / f"{ext.name}.log"
    ledger.record("file", path=str(log))
    log.touch()
    web = subprocess.Popen(pod_argv("podserver", "--pod", ext.name, "--port", str(EXT_WEB_PORT), "--log", str(log)),
                           preexec_fn=_netns.preexec(topo.netns(ext.name)), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
    ledger.record_process(f"podserver-{ext.name}", web.pid, netns=topo.netns(ext.name))
    return {"dnsmasq": pid, "web": web.pid, "resolver": ext.ip, "ttl": ttl}


def restart_dns(lab: str, topo: Topology, ttl: int) -> int:
    """Stop the lab's dnsmasq and start it again answering with TTL ``ttl``; returns its pid."""
    import os
    import signal

    from labkit.net.ledger import process_start_time, wait_gone

    ledger = Ledger(lab)
    for e in ledger.entries("process"):
        if e["name"] == "dnsmasq" and process_start_time(e["pid"]) == e.get("start"):
            os.kill(e["pid"], signal.SIGTERM)
            wait_gone(e["pid"], e.get("start"), 5)
    ledger.forget(lambda e: e["kind"] == "process" and e["name"] == "dnsmasq")
    return _start_dnsmasq(topo, ledger, ttl)
