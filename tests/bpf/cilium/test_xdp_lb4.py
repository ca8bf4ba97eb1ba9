"""Cilium's plain XDP NodePort scenarios: a request forwarded to a backend on another node, and a service without
backends dropped, on node-a's cil_xdp_entry in snat mode (``xdp_snat``; ``xdp_snat_drop``: the same built with
--service-no-backend-response=drop, as Cilium's file is compiled without SERVICE_NO_BACKEND_RESPONSE).

Cilium's file: bpf/tests/xdp_nodeport_lb4_test.c (@82999990). Its packet (:48-115) writes tot_len 40, id 0x5438
and both ports in host byte order and leaves the TCP doff 0; labkit's parser checks those fields (test_malformed.py),
so the translation sends the well-formed packet the fields name: 60 bytes of IP, DF set, TTL 64, SYN seq 2922048129
window 64240, the 20-byte payload, port 23445 to 80. Addresses are the lab's: the client 10.0.0.15 is ext
198.51.100.100, the frontend 10.0.1.15 is 203.0.113.10, the backend 10.2.0.15:8080 is b2 198.18.2.12:8080.
"""
from __future__ import annotations

import socket
import struct

from labkit.maps.lb import BackendState

from .. import packets
from .peer import DEFAULT_DATA, FRONTEND, REMOTE_BACKEND, add_service
from ..harness import EXT
from .fibns import XDP_DROP, assert_xdp_tx

FRONTEND_PORT, BACKEND_PORT, CLIENT_PORT = 80, 8080, 23445  # :42-44, :95


def _packet() -> bytes:
    """The request of build_packet (:48-115), well-formed (see the module docstring), its TCP checksum valid."""
    seg = struct.pack("!HHIIBBHHH", CLIENT_PORT, FRONTEND_PORT, 2922048129, 0, 5 << 4, packets.SYN, 64240, 0, 0)
    seg += DEFAULT_DATA
    pseudo = socket.inet_aton(EXT) + socket.inet_aton(FRONTEND) + struct.pack("!BBH", 0, 6, len(seg))
    seg = seg[:16] + struct.pack("!H", packets.csum(pseudo + seg)) + seg[18:]
    return packets.eth(packets.ipv4(EXT, FRONTEND, 6, seg, frag=0x4000, ident=0x5438),
                       dst="12:23:34:45:56:67", src="aa:bb:cc:dd:ee:ff")


def test_xdp_lb4_forward_to_other_node(xdp_snat, fib):
    """xdp_lb4_forward_to_other_node: XDP DNATs the request to the remote backend and sends it back out, its payload
    unchanged (bpf/tests/xdp_nodeport_lb4_test.c:117-198@82999990)."""
    add_service(xdp_snat, [(124, REMOTE_BACKEND, BACKEND_PORT, BackendState.ACTIVE)])  # :126-128
    r = fib.run_xdp(xdp_snat, _packet())
    assert_xdp_tx(r)  # :149 XDP_TX, :161-165 the FIB's MACs
    p = r.pkt
    assert p.dst == REMOTE_BACKEND  # :174
    assert p.dport == BACKEND_PORT  # :184
    assert p.payload == DEFAULT_DATA  # :187-195 "body changed"
    assert p.ip_csum_ok and p.l4_csum_ok


def test_xdp_lb4_drop_no_backend(xdp_snat_drop):
    """xdp_lb4_drop_no_backend: built without SERVICE_NO_BACKEND_RESPONSE, a request to a service counting no
    backend is XDP_DROP (bpf/tests/xdp_nodeport_lb4_test.c:200-236@82999990)."""
    add_service(xdp_snat_drop, [], count=0)  # :209
    assert xdp_snat_drop.run_xdp(_packet()).retval == XDP_DROP  # :222-233
