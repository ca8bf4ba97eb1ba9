"""The reply of a hairpin flow on the real kernel (issue 30 item 15): Cilium v1.16's from-container hands it,
untranslated, back to the pod it came from (handle_ipv4_from_lxc's hairpin_flow, bpf_lxc.c:1106-1119@82999990;
ipv4_local_delivery's ipv4_l3, l3.h:52-69 and 156-175@82999990), and the pod's ingress reverse-NATs it
(ipv4_policy → lb4_rev_nat with the loopback flag, bpf_lxc.c:1870-1885 and lb.h:1053-1085@82999990). A lab of
the module's own: the shared labs are other tests'."""
from __future__ import annotations

import pytest

from labtag import tagged

VIP_PORT = 80


@pytest.fixture(scope="module")
def hplab(_require_datapath):
    from labkit import Lab
    from labkit.config import DatapathConfig

    lab = Lab.up(tagged("dphair"), config=DatapathConfig(routing="native", gc_timer=False))
    yield lab
    lab.down()


def test_hairpin_reply_is_reverse_natted_at_the_pods_ingress(hplab):
    """a1 → its own Service: the SYN|ACK leaves a1's from-container as a1:8080 → 169.254.42.1 (forwarded, not
    translated, TTL 64 → 63 by the local delivery) and a1's to-container turns it into VIP:80 → a1; the
    connection works."""
    lab = hplab
    lab.reset()
    svc = lab.services.add("self", VIP_PORT, ["a1:8080"])
    conn = lab.pod("a1").tcp("self", VIP_PORT)
    step = conn.open()
    assert step.ok
    assert conn.send(b"hairpin").result["reply"] == b"hairpin".hex()
    a1 = lab.pod("a1").ip

    def synack(hook: str):
        return [f for f in step.flows if f.node == "node-a" and f.hook.label == hook
                and (f.to_json()["before"]["src"], f.to_json()["before"]["sport"]) == (a1, 8080)
                and f.to_json()["before"]["dst"] == "169.254.42.1"]

    out = synack("from-container")
    assert out and not any(f.translated for f in out), [f.line() for f in out]
    into = synack("to-container")
    assert into and all(f.translated for f in into), [f.line() for f in into]
    after = into[0].to_json()["after"]
    assert (after["src"], after["sport"], after["dst"], after["dport"]) == (svc.vip, VIP_PORT, a1, conn.sport)
    conn.close()
