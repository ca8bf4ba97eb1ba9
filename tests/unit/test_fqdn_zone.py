"""labkit.fqdn.zone: the lab zone's records and the dnsmasq command line that serves them."""
from __future__ import annotations

import ipaddress

from labkit.fqdn.zone import PROXY_MARK, PROXY_MARK_MASK, PROXY_ROUTE_TABLE, PROXY_RULE_PRIORITY, RECORDS, ZONE, dnsmasq_argv
from labkit.net.topology import Topology


def test_records_are_in_the_zone_and_ext_range():
    """Every name is under lab.example (RFC 2606) and every address in 198.51.100.0/24 (DESIGN.md §4), none of
    them a node's or ext's own address."""
    topo = Topology.default("demo")
    taken = {n.ip for n in topo.nodes} | {e.ip for e in topo.externals}
    for name, addr in RECORDS.items():
        assert name.endswith("." + ZONE) and ZONE == "lab.example"
        assert ipaddress.ip_address(addr) in ipaddress.ip_network("198.51.100.0/24") and addr not in taken


def test_dnsmasq_serves_only_the_zone():
    """dnsmasq reads no config, hosts or resolv.conf, binds only ext's address, answers lab.example locally
    (never forwarded) with each record's TTL, and logs queries to the lab's file."""
    argv = dnsmasq_argv("198.51.100.100", {"web.lab.example": "198.51.100.101"}, 7, "/run/labkit/x/dnsmasq.log")
    for flag in ("--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--bind-interfaces",
                 "--listen-address=198.51.100.100", "--port=53", "--local=/lab.example/", "--log-queries",
                 "--host-record=web.lab.example,198.51.100.101,7", "--log-facility=/run/labkit/x/dnsmasq.log"):
        assert flag in argv


def test_proxy_routing_numbers_are_ciliums():
    """fwmark 0x200/0xf00 → table 2004 at priority 9 (linux_defaults MagicMarkIsToProxy, RouteTableToProxy,
    RulePriorityToProxyIngress in v1.16)."""
    assert (PROXY_MARK, PROXY_MARK_MASK, PROXY_ROUTE_TABLE, PROXY_RULE_PRIORITY) == (0x200, 0xF00, 2004, 9)
