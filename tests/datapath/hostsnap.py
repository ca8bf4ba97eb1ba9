"""A snapshot of the host's own network namespace, to prove a test run left it as it was."""
from __future__ import annotations

import os

from pyroute2 import IPRoute

# Counters that move on their own, whatever labkit does.
VOLATILE_SYSCTLS = {
    "net/netfilter/nf_conntrack_count",
    "net/netfilter/nf_conntrack_buckets",
    "net/ipv4/tcp_mem",
    "net/ipv4/udp_mem",
}


def _sysctls() -> dict[str, str]:
    out = {}
    for root, _, files in os.walk("/proc/sys/net"):
        for name in files:
            path = os.path.join(root, name)
            key = path[len("/proc/sys/") :]
            if key in VOLATILE_SYSCTLS:
                continue
            try:
                with open(path) as f:
                    out[key] = f.read()
            except OSError:
                continue  # write-only knobs (route/flush) and per-boot secrets we may not read
    return out


def snapshot() -> dict:
    """Links, addresses, routes, rules, qdiscs and sysctls of the calling namespace."""
    with IPRoute() as ipr:
        links = sorted(
            (l.get_attr("IFLA_IFNAME"), l.get_attr("IFLA_MTU"), l.get_attr("IFLA_ADDRESS"), l.get_attr("IFLA_MASTER"))
            for l in ipr.get_links()
        )
        addrs = sorted((a["index"], a.get_attr("IFA_ADDRESS"), a["prefixlen"]) for a in ipr.get_addr())
        routes = sorted(
            (r.get_attr("RTA_TABLE"), r.get_attr("RTA_DST"), r["dst_len"], r.get_attr("RTA_GATEWAY"), r.get_attr("RTA_OIF"))
            for r in ipr.get_routes(family=2, table=0)
        )
        rules = sorted((r.get_attr("FRA_TABLE"), r.get_attr("FRA_PRIORITY"), r["src_len"], r["dst_len"]) for r in ipr.get_rules())
        qdiscs = sorted((q["index"], q.get_attr("TCA_KIND"), q["handle"], q["parent"]) for q in ipr.get_qdiscs())
    return {"links": links, "addrs": addrs, "routes": routes, "rules": rules, "qdiscs": qdiscs, "sysctls": _sysctls()}


def differences(before: dict, after: dict) -> list[str]:
    """Human-readable differences between two snapshots."""
    out = []
    for part in ("links", "addrs", "routes", "rules", "qdiscs"):
        gone = [x for x in before[part] if x not in after[part]]
        new = [x for x in after[part] if x not in before[part]]
        out += [f"{part}: removed {x}" for x in gone] + [f"{part}: added {x}" for x in new]
    for key in sorted(set(before["sysctls"]) | set(after["sysctls"])):
        if before["sysctls"].get(key) != after["sysctls"].get(key):
            out.append(f"sysctl {key}: {before['sysctls'].get(key)!r} -> {after['sysctls'].get(key)!r}")
    return out
