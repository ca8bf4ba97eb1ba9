"""A real client of labkit's Hubble JSON: ``hubble-audit2policy`` (PyPI) turns the AUDIT verdicts of a lab in policy
audit mode into CiliumNetworkPolicies, and ``labkit policy apply`` of what it wrote allows exactly the traffic it saw.

hubble-audit2policy reads ``hubble observe -o json`` lines (GetFlowsResponse, the flow's ``verdict``, ``source`` and
``destination`` endpoints with their ``namespace``, ``pod_name`` and ``labels`` — a workload by its ``k8s:app``
label — and ``l4``); labkit's lines carry them as v1.16's Hubble does (pkg/hubble/parser/common/endpoint.go:139-188
@82999990: the endpoint's labels, sorted, e.g. ``k8s:app=a1``). The lines are ``labkit observe -o json``'s:
one ``json.dumps`` of each response :func:`labkit.observe.hubble.last_flows` gives (labkit/cli/observe.py).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from labtag import tagged

from .util import wait_for

_CONNECT = r"""
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5).close()
    print("connected")
except OSError as exc:
    print("failed", type(exc).__name__)
"""


def _connects(lab, pod: str, peer: str, port: int = 8080) -> bool:
    out = lab.exec(pod, [sys.executable, "-c", _CONNECT, lab.pod(peer).ip, str(port)], timeout=30).stdout.strip()
    return out == "connected"


def _audit2policy() -> str:
    exe = Path(sys.executable).parent / "hubble-audit2policy"
    assert exe.exists(), "hubble-audit2policy is not installed: pip install -e '.[test]' (pyproject's test extras)"
    return str(exe)


@pytest.fixture
def audit_lab(_require_datapath):
    """Every endpoint enforced (--enable-policy=always) in audit mode: every new connection passes with an
    AUDIT verdict at both ends."""
    from labkit import Lab
    from labkit.config import DatapathConfig

    lab = Lab.up(tagged("a2paudit"), config=DatapathConfig(policy="always", policy_audit=True, gc_timer=False))
    yield lab
    lab.down()


@pytest.fixture
def enforcing_lab(_require_datapath):
    """The same lab as a default node enforces policy (--enable-policy=default, no audit)."""
    from labkit import Lab
    from labkit.config import DatapathConfig

    lab = Lab.up(tagged("a2penf"), config=DatapathConfig(policy="default", gc_timer=False))
    yield lab
    lab.down()


def test_audit2policy_yields_policies_that_allow_exactly_the_observed_traffic(audit_lab, enforcing_lab, tmp_path):
    """a1 -> b1:8080 observed in audit mode: hubble-audit2policy --verdict AUDIT writes allow-a1 (egress to app=b1
    on 8080/TCP) and allow-b1 (ingress from app=a1 on 8080/TCP); applied to an enforcing lab, a1 reaches b1 and
    what the policies govern admits nothing else (a2 -> b1, a1 -> b2 are denied)."""
    from labkit.observe.hubble import last_flows
    from labkit.observe.monitor import flushed_past

    assert _connects(audit_lab, "a1", "b1")
    flushed_past(audit_lab.name, audit_lab.pin_dirs)
    audits = wait_for(lambda: [r for r in last_flows(audit_lab) if r.get("flow", {}).get("verdict") == "AUDIT"]
                      or None, timeout=5, what="AUDIT verdicts in the Hubble ring")
    assert {(r["flow"]["source"]["pod_name"], r["flow"]["destination"]["pod_name"]) for r in audits} == {("a1", "b1")}
    flows = tmp_path / "flows.json"
    flows.write_text("".join(json.dumps(r) + "\n" for r in last_flows(audit_lab)))  # `labkit observe -o json`
    out = tmp_path / "policies.yaml"
    run = subprocess.run([_audit2policy(), str(flows), "--verdict", "AUDIT", "--no-enrich", "--single-file", str(out)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    docs = [d for d in yaml.safe_load_all(out.read_text()) if d]
    by_name = {d["metadata"]["name"]: d for d in docs}
    assert sorted(by_name) == ["allow-a1", "allow-b1"], out.read_text()
    assert by_name["allow-a1"]["spec"]["endpointSelector"] == {"matchLabels": {"app": "a1"}}
    assert by_name["allow-a1"]["spec"]["egress"][0]["toEndpoints"] == [{"matchLabels": {"app": "b1"}}]
    assert by_name["allow-b1"]["spec"]["ingress"][0]["fromEndpoints"] == [{"matchLabels": {"app": "a1"}}]

    lab = enforcing_lab
    assert _connects(lab, "a2", "b1") and _connects(lab, "a1", "b2"), "before any policy every connection passes"
    lab.policy.apply(out.read_text())
    assert _connects(lab, "a1", "b1"), "the observed connection is allowed"
    assert not _connects(lab, "a2", "b1"), "b1 admits only what was observed: a1"
    assert not _connects(lab, "a1", "b2"), "a1 may reach only what it was observed reaching: b1"
    # allow-a1 has egress rules only and allow-b1 ingress rules only: a default node enforces just those
    # directions (a1's ingress and b1's egress stay open), so b1 -> a1 still passes, as on a Cilium node.
    assert _connects(lab, "b1", "a1")
