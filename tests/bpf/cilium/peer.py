"""What the peer tier's tests share: Cilium's test addresses and the lab's in their place, frames built as
Cilium's pktgen builds them, and the IPv4 header Cilium's CHECKs expect.

Cilium's bpf/tests/pktgen.h (tag v1.16.0) builds a TCP packet with ``pktgen__push_ipv4_tcp_packet``: IP id 0,
TOS 0, TTL 64, no fragment bits (pktgen.h:287-305); TCP SYN, seq 123456, window 65535, doff 5 (pktgen.h:408-420);
pktgen assigns the seq in host order, so the wire carries 123456's little-endian bytes (40 e2 01 00); then
``default_data``, the 20 bytes of "Should not change!!" with its NUL (pktgen.h:97). Its checksum is computed
over the 20-byte header only (pktgen.h:826-827); its TCP checksum is left 0, where ours is valid (labkit's
programs check nothing, but the tier's parser does).

Address translation (Cilium's pktgen.h:47-66 → the harness's default lab, DESIGN §4):

================  ====================  =============================================
Cilium            its address            the lab's
================  ====================  =============================================
v4_ext_one        110.0.11.1             ext 198.51.100.100 (CLIENT)
v4_ext_two        120.0.12.2             198.51.100.101 (CLIENT_2, a second outside client)
v4_svc_one/two    172.16.10.1 / .2       the LoadBalancer VIP 203.0.113.10 (FRONTEND)
v4_node_one       10.0.10.1              node-a 198.51.100.11 (the node under test, LB_IP)
v4_pod_one        192.168.0.1            a2 198.18.1.12 (a backend on node-a)
v4_pod_two        192.168.0.2            b2 198.18.2.12 (a backend on node-b)
================  ====================  =============================================

The node whose programs run is always node-a. Where a Cilium test's LB is another node (a *_backend.c file), that
LB is node-b, 198.51.100.12.
"""
from __future__ import annotations

import socket
import struct

from .. import packets
from ..harness import A2, B2, EXT, LB_VIP, NODE_IP, TOPO

#: pktgen.h:97 default_data, with the NUL that sizeof() counts
DEFAULT_DATA = b"Should not change!!\0"
#: pktgen.h:412 ``hdr->seq = 123456`` into a __be32: the wire's bytes are 123456 little-endian
PKTGEN_SEQ = int.from_bytes(struct.pack("<I", 123456), "big")
CILIUM = {
    "v4_ext_one": "110.0.11.1", "v4_ext_two": "120.0.12.2", "v4_svc_one": "172.16.10.1",
    "v4_svc_two": "172.16.10.2", "v4_node_one": "10.0.10.1", "v4_pod_one": "192.168.0.1",
    "v4_pod_two": "192.168.0.2", "IPV4_LOOPBACK": "10.245.255.31",
}

CLIENT = EXT
CLIENT_2 = "198.51.100.101"
FRONTEND = LB_VIP
LB_IP = NODE_IP
REMOTE_LB_IP = TOPO.node("node-b").ip
LOCAL_BACKEND = A2.ip
REMOTE_BACKEND = B2.ip
CLIENT_PORT, FRONTEND_PORT, BACKEND_PORT = 111, 80, 8080

IPPROTO_TCP, IPPROTO_UDP, IPPROTO_ICMP = socket.IPPROTO_TCP, socket.IPPROTO_UDP, socket.IPPROTO_ICMP
L4_LEN = {IPPROTO_TCP: 20 + len(DEFAULT_DATA), IPPROTO_UDP: 8 + len(DEFAULT_DATA)}


def pktgen_tcp(src: str, dst: str, sport: int, dport: int, flags: int = packets.SYN, options: bytes = b"",
               ttl: int = 64) -> bytes:
    """A frame as ``pktgen__push_ipv4_tcp_packet`` + ``default_data`` builds it (checksums valid)."""
    seg = packets.tcp_segment(src, dst, sport, dport, flags, seq=PKTGEN_SEQ, payload=DEFAULT_DATA)
    return packets.eth(packets.ipv4(src, dst, IPPROTO_TCP, seg, options=options, ident=0, ttl=ttl))


def pktgen_udp(src: str, dst: str, sport: int, dport: int) -> bytes:
    """A frame as ``pktgen__push_ipv4_udp_packet`` + ``default_data`` builds it."""
    dgram = packets.udp_datagram(src, dst, sport, dport, DEFAULT_DATA)
    return packets.eth(packets.ipv4(src, dst, IPPROTO_UDP, dgram, ident=0))


def ip_header(src: str, dst: str, proto: int = IPPROTO_TCP, ttl: int = 64, l4_len: int | None = None,
              options: bytes = b"", csum_options: bool = True) -> bytes:
    """The IPv4 header a Cilium CHECK expects, id 0 and TOS 0 as pktgen writes them: ``l4_len`` bytes follow it;
    ``csum_options=False`` sums the first 20 bytes only, as pktgen does for a header it built with options."""
    l4 = L4_LEN[proto] if l4_len is None else l4_len
    ihl = 5 + len(options) // 4
    hdr = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, ihl * 4 + l4, 0, 0, ttl, proto, 0,
                      socket.inet_aton(src), socket.inet_aton(dst)) + options
    check = packets.csum(hdr if csum_options else hdr[:20])
    return hdr[:10] + struct.pack("!H", check) + hdr[12:]


def l3_check(header: bytes) -> int:
    """The header checksum field, as a Cilium CHECK compares it (``l3->check != bpf_htons(0x....)``)."""
    return struct.unpack_from("!H", header, 10)[0]


def frame_ip_header(frame: bytes) -> bytes:
    """The IPv4 header (options included) of an Ethernet frame."""
    ihl = (frame[14] & 0x0F) * 4
    return frame[14:14 + ihl]


def ttl(frame: bytes) -> int:
    return frame[14 + 8]


def dsr_option(vip: str, port: int) -> bytes:
    """Cilium's ``struct dsr_opt_v4`` as the CHECKs read it: type 0x9a, length 8, then ``opt->port ==
    __bpf_ntohs(FRONTEND_PORT)`` and ``opt->addr == __bpf_ntohl(FRONTEND_IP)``: port and address in host order,
    stored little-endian (tc_nodeport_lb4_dsr_lb.c:182-189@82999990)."""
    addr = struct.unpack("!I", socket.inet_aton(vip))[0]
    return bytes([0x9A, 0x08]) + struct.pack("<H", port) + struct.pack("<I", addr)


def icmp_port_unreachable(frame: bytes, src: str, dst: str) -> bytes:
    """The IPv4 + ICMP packet Cilium's ``__tail_no_service_ipv4`` makes of the Ethernet ``frame``
    (bpf/lib/lb.h:1718-1823@82999990): ``sample_len`` is the whole frame's length (``ctx_full_len``, Ethernet
    header included) capped at 64; the frame is cut, or grown with zeros, to the Ethernet header plus
    ``sample_len`` bytes, so the sample is the original IP packet from its start, ``sample_len`` bytes long. In
    front of it go an ICMP destination unreachable / port unreachable header (rest of header 0) and an IPv4 header
    from the frontend to the client: TOS copied, id 0, no fragment bits, TTL IPDEFTTL (64), both checksums
    computed."""
    sample_len = min(len(frame), 64)
    sample = (frame[14:] + bytes(64))[:sample_len]
    icmp = struct.pack("!BBHI", 3, 3, 0, 0) + sample
    icmp = icmp[:2] + struct.pack("!H", packets.csum(icmp)) + icmp[4:]
    hdr = struct.pack("!BBHHHBBH4s4s", 0x45, frame[15], 20 + len(icmp), 0, 0, 64, IPPROTO_ICMP, 0,
                      socket.inet_aton(src), socket.inet_aton(dst))
    hdr = hdr[:10] + struct.pack("!H", packets.csum(hdr)) + hdr[12:]
    return hdr + icmp


def add_service(node, backends, rev_nat: int = 1, frontend: str = FRONTEND, port: int = FRONTEND_PORT,
                count: int | None = None) -> None:
    """Cilium's test helpers ``lb_v4_add_service`` + ``lb_v4_add_backend`` (bpf/tests/lib/lb.h:6-80@82999990): the
    head with SVC_FLAG_ROUTABLE only, a slot per backend, the reverse NAT entry. ``backends``: ``[(id, ip, port,
    state)]``. (Cilium's helper writes the head under both lookup scopes; labkit's datapath reads the external one,
    the only one a single-scope service has.)"""
    from labkit.maps.lb import ServiceFlags

    node.service(frontend, port, backends, flags=ServiceFlags.ROUTABLE, count=count, service_id=rev_nat)


def lab_difference(fragment: str) -> str:
    """The LAB_DIFFERENCES entry (labkit/config.py) that declares what a translation asserts in place of Cilium's
    expectation: a test that checks labkit's declared behaviour calls this, so the declaration cannot go away
    while the test still relies on it."""
    from labkit.config import LAB_DIFFERENCES

    found = [d for d in LAB_DIFFERENCES if fragment in d]
    assert found, f"no LAB_DIFFERENCES entry says {fragment!r}"
    return found[0]


KERNEL_ROUTES = "routed to the pod by the node's kernel"
DSR_OPTION_REMOVED = "removes the DSR IPv4 option"
SAME_NODE_ROUTED = "ipv4_local_delivery"
XDP_REQUESTS_ONLY = "XDP program load-balances the client's requests only"
