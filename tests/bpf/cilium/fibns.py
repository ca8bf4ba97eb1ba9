"""A FIB for the XDP test runs: Cilium's XDP tests mock ``fib_lookup`` (its answer names the device and MACs the
CHECKs then compare); labkit's cil_xdp_entry calls the kernel's bpf_fib_lookup on the frame's ingress device, which
in a plain test run is lo of the caller's namespace, where no route to a backend exists (DROP_NO_FIB).

:class:`FibNamespace` is a network namespace of this test process's own (``lkpeer-<pid>``) holding what node-a's
eth0 holds in a lab: a veth ``eth0`` with node-a's address and a MAC of its own, the route to node-b's pods via
node-b, permanent neighbour entries for node-b and the outside client, and forwarding on.
:meth:`FibNamespace.run_xdp` test-runs the XDP program with ``xdp_md.ingress_ifindex`` naming that eth0 (the kernel
resolves it in the calling thread's namespace, so the run enters the namespace for the call and leaves it after):
the FIB then answers as on node-a, XDP_TX out of eth0 with node-b's MAC as destination and eth0's as source.

The namespace is removed when the session ends; nothing touches the host's own namespace.
"""
from __future__ import annotations

import ctypes
import os
from contextlib import contextmanager

from labkit.datapath.testrun import prog_test_run

from ..harness import EXT, NODE_IP, TOPO, Outcome

CLONE_NEWNET = 0x40000000
NUD_PERMANENT = 0x80
ETH0_MAC = "02:00:c6:33:64:0b"  #: node-a's eth0 in the namespace (its address's bytes)
NODE_B_MAC = "02:00:c6:33:64:0c"  #: node-b's eth0, the next hop to its pods
EXT_MAC = "02:00:c6:33:64:64"  #: the outside client's
XDP_DROP, XDP_PASS, XDP_TX = 1, 2, 3
_libc = ctypes.CDLL(None, use_errno=True)


def mac(text: str) -> bytes:
    return bytes(int(x, 16) for x in text.split(":"))


def assert_xdp_tx(r) -> None:
    """Cilium's ``fib_ok(status)`` (XDP_TX or XDP_REDIRECT; here XDP_TX, back out of eth0) and the MACs its mocked
    fib_lookup handed the program (``lb_mac`` as source, ``remote_backend_mac`` as destination): run in the FIB
    namespace, the kernel's lookup answers with eth0's MAC and node-b's, the next hop to node-b's pods."""
    assert r.retval == XDP_TX, (r.retval, r.event.drop_reason)
    assert (r.frame[0:6], r.frame[6:12]) == (mac(NODE_B_MAC), mac(ETH0_MAC))


class XdpMd(ctypes.Structure):
    """``struct xdp_md`` (uapi/linux/bpf.h), the context of an XDP test run: ``data_end`` must be the frame's
    length and ``data_meta``/``egress_ifindex`` 0; ``ingress_ifindex`` names a device of the caller's namespace."""

    _fields_ = [(name, ctypes.c_uint32) for name in
                ("data", "data_end", "data_meta", "ingress_ifindex", "rx_queue_index", "egress_ifindex")]


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


class FibNamespace:
    """node-a's eth0, routes and neighbours in a namespace of the test's own (see the module docstring)."""

    def __init__(self):
        from pyroute2 import NetNS, netns

        self.name = f"lkpeer-{os.getpid()}"
        netns.create(self.name)
        try:
            with NetNS(self.name) as ns:
                ns.link("add", ifname="eth0", kind="veth", peer="fabric", address=ETH0_MAC)
                self.ifindex = ns.link_lookup(ifname="eth0")[0]
                for name in ("eth0", "fabric", "lo"):
                    ns.link("set", index=ns.link_lookup(ifname=name)[0], state="up")
                ns.addr("add", index=self.ifindex, address=NODE_IP, prefixlen=24)
                node_b = TOPO.node("node-b").ip
                for ip, mac in ((node_b, NODE_B_MAC), (EXT, EXT_MAC)):
                    ns.neigh("add", dst=ip, lladdr=mac, ifindex=self.ifindex, state=NUD_PERMANENT)
                for pod in TOPO.pods_on("node-b"):
                    ns.route("add", dst=f"{pod.ip}/32", gateway=node_b, oif=self.ifindex)
            # bpf_fib_lookup without BPF_FIB_LOOKUP_OUTPUT is a lookup for a packet received on eth0: it answers
            # FWD_DISABLED unless the device forwards, as a node's eth0 does
            with self.entered():
                for name in ("all", "eth0"):
                    with open(f"/proc/sys/net/ipv4/conf/{name}/forwarding", "w") as f:
                        f.write("1")
        except BaseException:
            netns.remove(self.name)
            raise

    @contextmanager
    def entered(self):
        """The calling thread in the namespace for the block (its own namespace back after)."""
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/var/run/netns/{self.name}", os.O_RDONLY)
        try:
            _setns(target)
            try:
                yield
            finally:
                _setns(own)
        finally:
            os.close(own)
            os.close(target)

    def run_xdp(self, node, frame: bytes) -> Outcome:
        """Test-run ``node``'s cil_xdp_entry on ``frame`` as received on this namespace's eth0."""
        node.drain()
        with self.entered():
            r = prog_test_run(node.build.prog_fd("cil_xdp_entry"), frame,
                              ctx=XdpMd(data=0, data_end=len(frame), ingress_ifindex=self.ifindex))
        return Outcome(r.retval, r.data, node.drain(), None)

    def close(self) -> None:
        from pyroute2 import netns

        netns.remove(self.name)
