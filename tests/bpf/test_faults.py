"""Every datapath fault (``labkit fault``; bits of ``labkit_config``, see
bpf/lib/config_types.h and labkit.maps.config.Fault) is caught by this tier:
with the fault set, at least one of the tests below fails, because the
behaviour it pins is the behaviour the fault breaks.

The socket-LB faults act in bpf_sock.c's cgroup/sock_addr programs, which
BPF_PROG_TEST_RUN cannot run (the kernel answers ENOTSUPP for that program
type); tests/datapath/test_socket_lb.py catches them on real sockets. So does
sock-no-redirect, in bpf_sockops.c's sock_ops program (no runner either):
tests/datapath/test_sockmap.py catches it. Agent
faults (labkit.maps.config.AGENT_FAULTS) live in user space, not in the
programs, and are out of this tier's scope.
"""
from __future__ import annotations

import inspect

import pytest

from labkit.datapath.testrun import sock_addr_test_run_supported
from labkit.maps.config import Fault

from . import test_conntrack as ct
from . import test_encap as encap
from . import test_lb as lb
from . import test_nodeport as nodeport
from . import test_xdp as xdp

#: fault → the tests that must fail while it is set.
FLIPS = {
    Fault.NO_IN_ENTRY: [ct.test_to_container_syn_creates_in_entry],
    Fault.SKIP_REV_NAT: [lb.test_reply_is_reverse_translated, lb.test_hairpin_in_entry_and_reply],
    Fault.WRONG_LIFETIME: [ct.test_ack_sets_seen_non_syn_and_tcp_lifetime],
    Fault.NO_LOOPBACK_SNAT: [lb.test_hairpin_snat_to_loopback],
    Fault.NO_RELATED: [ct.test_new_entry_has_related_twin],
    Fault.NO_DSR_SNAT: [nodeport.test_dsr_reply_leaves_as_the_vip],
    Fault.NO_OUT_ENTRY: [ct.test_syn_creates_out_entry],
    Fault.NO_FLAGS_SEEN: [ct.test_syn_creates_out_entry, ct.test_syn_ack_is_reply_of_out_entry],
    Fault.NO_CLOSE: [ct.test_fin_both_ways_closes_entry, ct.test_rst_before_handshake_closes_both],
    Fault.NO_ACCOUNTING: [ct.test_accounting_counts_packets_and_bytes],
    Fault.NO_TUNNEL: [encap.test_remote_pod_goes_into_the_tunnel],
    Fault.NO_FIB: [encap.test_to_netdev_lets_pod_traffic_leave],
    Fault.NO_SVC_ENTRY: [lb.test_svc_entry_and_out_entry_carry_the_service],
    Fault.PICK_TERMINATING: [lb.test_new_flows_skip_terminating_backend],
    Fault.NO_SNAT: [nodeport.test_snat_request_leaves_from_node_address],
    Fault.MAGLEV_WRONG_HASH: [lb.test_maglev_table_picks_the_flows_slot_at_the_uplink],
    Fault.XDP_PASS: [xdp.test_no_backend_answered_in_xdp_as_tc_answers],
}

_SOCK_REASON = ("acts in bpf_sock.c's cgroup/sock_addr programs; BPF_PROG_TEST_RUN has no runner for "
                "BPF_PROG_TYPE_CGROUP_SOCK_ADDR (ENOTSUPP), so tests/datapath/test_socket_lb.py covers it")
#: faults this tier cannot reach, and why.
NOT_COVERABLE = {
    Fault.SOCK_LB_OFF: _SOCK_REASON,
    Fault.NO_GETPEERNAME: _SOCK_REASON,
    Fault.SOCK_NO_REJECT: _SOCK_REASON,
    Fault.SOCK_NO_REDIRECT: "acts in bpf_sockops.c's cgroup/sock_ops program, which BPF_PROG_TEST_RUN has no runner for "
                            "(BPF_PROG_TYPE_SOCK_OPS); tests/datapath/test_sockmap.py covers it on real sockets",
}


def _node_fixture(test) -> str:
    (name,) = inspect.signature(test).parameters
    return name


@pytest.mark.parametrize("fault", list(FLIPS), ids=lambda f: f.name.lower().replace("_", "-"))
def test_fault_flips_its_tests(fault, request):
    """Each covered test passes with no fault and fails with its fault set."""
    for test in FLIPS[fault]:
        node = request.getfixturevalue(_node_fixture(test))
        node.reset()
        test(node)
        node.reset(faults=fault)
        with pytest.raises(AssertionError):
            test(node)
        node.reset()


def test_every_fault_is_covered_or_explained(_require_bpf):
    """Every Fault member flips a test here or is listed as not coverable, and only socket-LB faults, for a reason that still holds."""
    assert set(FLIPS) | set(NOT_COVERABLE) == set(Fault), "a fault nobody catches: add it to FLIPS"
    assert not set(FLIPS) & set(NOT_COVERABLE)
    assert all(f.name.startswith("SOCK_") or f is Fault.NO_GETPEERNAME for f in NOT_COVERABLE)
    supported, why = sock_addr_test_run_supported()
    assert not supported, "this kernel test-runs cgroup/sock_addr programs: cover the socket-LB faults here"
    assert "ENOTSUPP" in why or "EINVAL" in why, why
