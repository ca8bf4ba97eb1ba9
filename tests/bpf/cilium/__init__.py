"""The Cilium peer tier: Cilium's own ``bpf/tests`` scenarios (tag v1.16.0, commit 82999990) run on labkit's
programs with BPF_PROG_TEST_RUN, through the BPF unit tier's harness (tests/bpf/harness.py).

Each test translates one CHECK of a Cilium test file: the same packet (pktgen's defaults: IP id 0, TTL 64, TCP SYN
seq 123456 window 65535, the payload "Should not change!!"), the same map setup, the same hook, and the same
assertions (verdict, addresses, ports, TTL and header checksum, CT and NAT rows), each citing
``bpf/tests/<file>:<line>@82999990``. Cilium's addresses are the lab's (:mod:`tests.bpf.cilium.peer` maps them);
its header checksum constants are checked against the lab's frame by rebuilding the header Cilium expects with the
lab's addresses — ``test_tier.py`` proves that rebuilding reproduces each of Cilium's constants from Cilium's own
addresses.

:data:`FAMILIES` lists, per hook family labkit has, every Cilium test file of the family at the tag. Each is either
translated (a test module of this package cites it) or in :data:`DECLARED` with the reason labkit cannot express it;
``test_tier.py`` checks it, and that no test file of the tag that names one of these families is missing here.
A CHECK inside a translated file that labkit cannot express is in :data:`DECLARED_CHECKS`.
"""
from __future__ import annotations

CILIUM_TAG = "v1.16.0"
CILIUM_COMMIT = "82999990bc954699cf24853ef9747d9166ee24c8"

#: Every Cilium v1.16.0 bpf/tests file of the hook families labkit has.
FAMILIES: dict[str, tuple[str, ...]] = {
    "NodePort DSR (LB and backend)": (
        "tc_nodeport_lb4_dsr_lb.c", "tc_nodeport_lb4_dsr_backend.c", "xdp_nodeport_lb4_dsr_lb.c",
        "tc_nodeport_lb6_dsr_lb.c", "tc_nodeport_lb6_dsr_backend.c", "xdp_nodeport_lb6_dsr_lb.c",
        "nodeport_geneve_dsr_lb_xdp.c",
    ),
    "NodePort SNAT (LB and backend)": (
        "tc_nodeport_lb4_nat_lb.c", "tc_nodeport_lb4_nat_backend.c", "xdp_nodeport_lb4_nat_lb.c",
        "xdp_nodeport_lb4_nat_backend.c", "tc_nodeport_l3_dev.c", "tc_nodeport_l3_dev_to_tunnel.c",
        "skip_tunnel_nodeport_masq.c", "skip_tunnel_nodeport_nat.c", "skip_tunnel_nodeport_revnat.c",
        "l4lb_ipip_health_check_host.c", "bpf_nat_tests.c",
    ),
    "no backend": (
        "tc_nodeport_lb4_no_backend.c", "tc_lxc_lb4_no_backend.c", "tc_nodeport_lb6_no_backend.c",
        "tc_lxc_lb6_no_backend.c",
    ),
    "hairpin": ("tc_nodeport_test.c", "hairpin_sctp_flow.c"),
    "conntrack": ("conntrack_test.c", "bpf_ct_tests.c"),
    "terminating backends": ("tc_nodeport_lb_terminating_backend.c",),
    "session affinity": ("session_affinity_test.c",),
    "XDP": ("xdp_nodeport_lb4_test.c", "xdp_egressgw_reply.c"),
    "socket LB": ("host_only_socket_lb_test.c", "skip_lb_xlate_socket_lb.c", "wildcard_lookup.c"),
}

#: A file of :data:`FAMILIES` labkit cannot express, and why.
DECLARED: dict[str, str] = {
    "tc_nodeport_lb6_dsr_lb.c": "IPv6: labkit's datapath is IPv4 only (DESIGN §4)",
    "tc_nodeport_lb6_dsr_backend.c": "IPv6: labkit's datapath is IPv4 only",
    "xdp_nodeport_lb6_dsr_lb.c": "IPv6: labkit's datapath is IPv4 only",
    "tc_nodeport_lb6_no_backend.c": "IPv6: labkit's datapath is IPv4 only",
    "tc_lxc_lb6_no_backend.c": "IPv6: labkit's datapath is IPv4 only",
    "nodeport_geneve_dsr_lb_xdp.c": "Geneve DSR dispatch: the lab's kernel has no geneve device; labkit dispatches "
                                    "DSR with the IPv4 option only (LAB_DIFFERENCES)",
    "tc_nodeport_l3_dev.c": "an L3 (no Ethernet header) native device: every lab link is an Ethernet veth",
    "tc_nodeport_l3_dev_to_tunnel.c": "an L3 native device and NodePort into the tunnel: every lab link is an "
                                      "Ethernet veth",
    "skip_tunnel_nodeport_masq.c": "--skip-tunnel (ENABLE_SKIP_TUNNEL, a hybrid of tunnel and native routing): not "
                                   "a labkit routing mode",
    "skip_tunnel_nodeport_nat.c": "--skip-tunnel: not a labkit routing mode",
    "skip_tunnel_nodeport_revnat.c": "--skip-tunnel: not a labkit routing mode",
    "l4lb_ipip_health_check_host.c": "the standalone L4LB's IPIP health-check path (bpf_host from-host with "
                                     "ENABLE_HEALTH_CHECK): labkit has no IPIP and no from-host program",
    "hairpin_sctp_flow.c": "SCTP (ENABLE_SCTP): labkit's parser reads the ports of TCP and UDP only "
                           "(bpf/lib/parse.h), so an SCTP flow has no ports to load-balance or translate; "
                           "tc_nodeport_test.c is the same hairpin flow over TCP and is translated",
    "xdp_egressgw_reply.c": "the egress gateway: not a labkit feature",
    "bpf_nat_tests.c": "SNAT of ICMP: snat_v4_nat/snat_v4_rev_nat translating an ICMP error's inner header (frag "
                       "needed about a NATed TCP, UDP, ICMP or SCTP flow) and ICMP echo ids; labkit's NAT (bpf/lib/"
                       "nat.h) translates TCP and UDP only, so an ICMP error about an SNATed NodePort flow reaches "
                       "the LB node untranslated (LAB_DIFFERENCES: \"the NAT map translates TCP and UDP only\")",
    "host_only_socket_lb_test.c": "calls bpf_sock.c's functions from a test program; labkit's socket LB hooks are "
                                  "cgroup/sock_addr programs, which the lab's kernel cannot test-run (ENOTSUPP: "
                                  "labkit.datapath.testrun.sock_addr_test_run_supported); tests/datapath covers "
                                  "socket LB on real sockets",
    "skip_lb_xlate_socket_lb.c": "the Local Redirect Policy (ENABLE_LOCAL_REDIRECT_POLICY): not a labkit feature; "
                                 "and the socket hooks cannot be test-run here (host_only_socket_lb_test.c)",
    "wildcard_lookup.c": "sock4_wildcard_lookup (socket LB's NodePort/hostPort lookup by 0.0.0.0) called from a test "
                         "program: the socket hooks cannot be test-run here (host_only_socket_lb_test.c), and labkit's "
                         "bpf_sock.c leaves the wildcard lookup out (its header comment)",
}

#: CHECKs of translated files that labkit cannot express (``file:line`` of the CHECK), and why.
DECLARED_CHECKS: dict[str, str] = {
    "tc_nodeport_lb4_dsr_backend.c:589": "the reply to a second client leaving by another device (a mocked FIB "
                                         "answer naming ifindex 26): a lab node has one uplink and hands replies to "
                                         "its kernel",
    "tc_nodeport_lb4_nat_lb.c:482": "the same multi-device reply redirect as tc_nodeport_lb4_dsr_backend.c:589",
    "tc_nodeport_lb4_nat_lb.c:884": "a reply whose FIB lookup fails: labkit's tc reply path redirects with "
                                    "bpf_redirect_neigh and makes no FIB lookup that a test could fail",
    "xdp_nodeport_lb4_nat_lb.c:435": "reverse SNAT of the backend's reply in XDP: labkit's XDP program handles "
                                     "requests only, replies stay with tc (LAB_DIFFERENCES); tc's is "
                                     "tc_nodeport_lb4_nat_lb.c:853, translated",
    "xdp_nodeport_lb4_nat_lb.c:466": "the same, with a failing FIB lookup",
}
