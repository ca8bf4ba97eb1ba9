"""tc verbs for BPF programs on clsact, in pyroute2's own vocabulary.

Each call reads like the command it replaces:

=================================================  =============================================
``ensure_clsact(ipr, idx)``                        ``tc qdisc add dev X clsact``
``add_bpf_filter(ipr, idx, "ingress", fd, name)``  ``tc filter add dev X ingress prio 1 handle 1
                                                   bpf da fd N name NAME``
``del_filter(ipr, idx, "ingress", prio, handle)``  ``tc filter del dev X ingress prio 1 handle 1 bpf``
``filter_names(ipr, idx, "ingress")``              ``tc filter show dev X ingress``
=================================================  =============================================

Only filters labkit added are ever removed, by their exact prio and handle;
a clsact qdisc is removed only if labkit created it and nothing else is on it.
"""
from __future__ import annotations

__all__ = ["PARENTS", "ensure_clsact", "add_bpf_filter", "del_filter", "filter_names", "show_command", "PRIO"]

PARENTS = {"ingress": "ffff:fff2", "egress": "ffff:fff3"}
PRIO = 1  # labkit's filters sit first, like Cilium's
HANDLE = 1
_ETH_P_ALL = 0x0003


def ensure_clsact(ipr, index: int) -> bool:
    """Add a clsact qdisc unless one is there; True if this call created it."""
    for q in ipr.get_qdiscs(index=index):
        if q.get_attr("TCA_KIND") == "clsact":
            return False
    ipr.tc("add", "clsact", index)
    return True


def add_bpf_filter(ipr, index: int, direction: str, fd: int, name: str) -> dict:
    """Attach program ``fd`` in direct-action mode; returns what deletion needs."""
    ipr.tc(
        "add-filter",
        "bpf",
        index,
        HANDLE,
        fd=fd,
        name=name,
        parent=PARENTS[direction],
        classid=1,
        direct_action=True,
        prio=PRIO,
        protocol=_ETH_P_ALL,
    )
    return {"direction": direction, "prio": PRIO, "handle": HANDLE}


def del_filter(ipr, index: int, direction: str, prio: int, handle: int) -> bool:
    """Delete one filter by its exact place; False if it was already gone."""
    from pyroute2.netlink.exceptions import NetlinkError  # with ``ipr``: only where pyroute2 is in use

    try:
        ipr.tc("del-filter", "bpf", index, handle, parent=PARENTS[direction], prio=prio, protocol=_ETH_P_ALL)
    except NetlinkError as exc:
        if exc.code in (2, 19, 22):  # ENOENT, ENODEV, EINVAL: nothing there any more
            return False
        raise
    return True


def filter_names(ipr, index: int, direction: str) -> list[str]:
    """Names of the BPF programs on one side of a device."""
    names = []
    for f in ipr.get_filters(index=index, parent=PARENTS[direction]):
        opts = f.get_attr("TCA_OPTIONS")
        if opts is not None and opts.get_attr("TCA_BPF_NAME"):
            names.append(opts.get_attr("TCA_BPF_NAME"))
    return names


def show_command(netns: str, ifname: str, direction: str) -> str:
    """The command a learner runs to see the same filters."""
    return f"ip netns exec {netns} tc filter show dev {ifname} {direction}"
