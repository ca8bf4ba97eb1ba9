"""XDP verbs for a node's eth0, in pyroute2's vocabulary, and two veth details XDP needs.

=============================================  ================================================
``attach(ipr, idx, fd)``                       ``ip link set dev eth0 xdpdrv fd N`` (native mode)
``detach(ipr, idx)``                           ``ip link set dev eth0 xdp off``
``attached(ipr, idx)``                         ``ip -d link show eth0`` (``prog/xdp id N``)
=============================================  ================================================

Native mode on a veth: the program runs in the veth's own NAPI poll, on the frame its peer handed over,
before the receiving namespace's stack (tc ingress included) sees anything: a drop there frees the frame
before any hook of the node runs (the sender's skb existed, on the other side of the veth; on a NIC nothing
but the DMA buffer would have).

- XDP_TX hands the frame back to the peer as an xdp_frame, which the peer takes only while it runs NAPI.
  On this kernel (6.18) turning GRO on at the peer (which gives a veth NAPI without XDP since Linux 5.13) was
  not enough: ``ethtool -S eth0`` counted rx_queue_0_xdp_tx, no error, and nothing reached the fabric bridge.
  An XDP program on the peer (``lab_xdp_pass`` in bpf/bpf_xdp.c, XDP_PASS for everything) was: labkit
  attaches one to the fabric end of each node's uplink.
- A local sender's TCP/UDP checksum on a veth is unfinished (CHECKSUM_PARTIAL: only the pseudo-header sum,
  completed by a NIC or trusted as metadata by the receiver). An XDP_TX frame loses that metadata, so the
  backend's kernel verifies it and drops it. The client outside the cluster therefore sends complete
  checksums, as a NIC on a wire would deliver them: labkit turns TX checksumming off on ``ext``'s eth0
  (:mod:`labkit.net.build`).
"""
from __future__ import annotations

from labkit.errors import DatapathError

__all__ = ["attach", "detach", "attached", "show_commands"]


def attach(ipr, index: int, fd: int) -> dict:
    """Attach program ``fd`` in native mode; returns what :func:`detach` needs.

    No IFLA_XDP_FLAGS is sent: pyroute2 0.7 encodes that attribute in 2 bytes where the kernel wants a u32, and
    rejects the message (ERANGE). Without flags the kernel attaches in native mode whenever the driver has it
    (veth has), else in generic mode, so the mode is read back and anything but native is an error.
    """
    ipr.link("set", index=index, xdp={"attrs": [("IFLA_XDP_FD", fd)]})
    got = attached(ipr, index)
    if not got or got["mode"] != "xdpdrv":
        detach(ipr, index)
        raise DatapathError(f"XDP program on ifindex {index}: expected native mode (xdpdrv), got "
                            f"{got['mode'] if got else 'nothing attached'}")
    return {"mode": "xdpdrv"}


def detach(ipr, index: int) -> None:
    """Remove the device's XDP program (nothing there: nothing happens)."""
    ipr.link("set", index=index, xdp={"attrs": [("IFLA_XDP_FD", -1)]})


def attached(ipr, index: int) -> dict | None:
    """``{"mode": "xdpdrv", "prog_id": N}`` for the device's XDP program, or None."""
    link = ipr.get_links(index)[0]
    xdp = link.get_attr("IFLA_XDP")
    if xdp is None or not xdp.get_attr("IFLA_XDP_ATTACHED"):
        return None
    # XDP_ATTACHED_* (if_link.h): 1 native, 2 generic, 3 offloaded; pyroute2 names 1 'xdp'
    mode = {1: "xdpdrv", "xdp": "xdpdrv", 2: "xdpgeneric", 3: "xdpoffload"}.get(xdp.get_attr("IFLA_XDP_ATTACHED"),
                                                                                  "xdpmulti")
    return {"mode": mode, "prog_id": xdp.get_attr("IFLA_XDP_PROG_ID")}


def show_commands(netns: str, ifname: str = "eth0") -> list[str]:
    """The commands a learner runs to see the same program."""
    return [f"ip netns exec {netns} ip -d link show {ifname}", f"ip netns exec {netns} bpftool net show dev {ifname}"]
