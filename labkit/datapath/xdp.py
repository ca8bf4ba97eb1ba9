"""XDP verbs for a node's eth0, in pyroute2's vocabulary, and the veth detail XDP_TX needs.

=============================================  ================================================
``attach(ipr, idx, fd)``                       ``ip link set dev eth0 xdpdrv fd N`` (native mode)
``detach(ipr, idx)``                           ``ip link set dev eth0 xdpdrv off``
``attached(ipr, idx)``                         ``ip -d link show eth0`` (``prog/xdp id N``)
``enable_gro(ifname)``                         ``ethtool -K IFNAME gro on``
=============================================  ================================================

Native mode on a veth: the program runs in the veth's own NAPI poll, on the frame its peer handed over,
before the receiving namespace's stack (tc ingress included) sees anything. A frame the program returns
with XDP_TX goes back to the peer as an xdp_frame; the kernel's veth_xdp_xmit() accepts it only when the
peer runs NAPI, which a veth does when it has an XDP program of its own or GRO turned on (Linux 5.13,
"veth: allow enabling NAPI even without XDP"). Without either, every XDP_TX frame is silently dropped
(the sender's ``ip -s link`` counts it as a TX drop). labkit turns GRO on for the fabric end of each
node's uplink when the lab is built with ``--nodeport-accel xdp``.
"""
from __future__ import annotations

import ctypes
import fcntl
import socket
import struct

from labkit.errors import DatapathError

__all__ = ["attach", "detach", "attached", "enable_gro", "show_commands"]

_SIOCETHTOOL = 0x8946
_ETHTOOL_SGRO = 0x0000002c


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


def enable_gro(ifname: str) -> None:
    """Turn GRO on for ``ifname`` in the calling thread's namespace (``ethtool -K IFNAME gro on``)."""
    value = ctypes.create_string_buffer(struct.pack("II", _ETHTOOL_SGRO, 1))
    ifreq = struct.pack("16sP", ifname.encode(), ctypes.addressof(value))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s.fileno(), _SIOCETHTOOL, ifreq)


def show_commands(netns: str, ifname: str = "eth0") -> list[str]:
    """The commands a learner runs to see the same program."""
    return [f"ip netns exec {netns} ip -d link show {ifname}", f"ip netns exec {netns} bpftool net show dev {ifname}"]
