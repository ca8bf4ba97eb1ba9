"""Record a TCP connection on the real datapath as a JSON fixture for the unit tests (root; one lab).

    CI=true LABKIT_TEST_TAG=-xy PYTHONPATH=. python tests/record_trace.py tests/unit/data/tcp_conn_trace.json

Two connections, each open, send, close: a1 -> b1:8080 (pod to pod through the tunnel) and a1 -> the
Service web:80 whose one backend is b2:8080 (DNAT at from-container, reverse NAT at to-container). Each
step is written with its records (the raw events in hex, node and device names) and every node's
CT rows before and after, so tests rebuild the same Flow and CtRow objects (tracefixtures.recorded_steps).
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict

from labkit.config import DatapathConfig
from labkit.lab import Lab
from labtag import tagged


def row_data(row) -> dict:
    data = asdict(row)
    data["key"] = row.key.hex()
    return data


def step_data(step) -> dict:
    return {
        "title": step.title,
        "now": step.now,
        "result": {k: v for k, v in step.result.items() if isinstance(v, (str, int, float, bool, type(None)))},
        "flows": [{"node": f.node, "device": f.device, "event": bytes(f.event).hex()} for f in step.flows],
        "before": {n: [row_data(r) for r in rows] for n, rows in step.before.items()},
        "after": {n: [row_data(r) for r in rows] for n, rows in step.after.items()},
    }


def main(out: str) -> None:
    lab = Lab.up(tagged("rec"), config=DatapathConfig().with_options(gc_timer=False))
    try:
        lab.reset()
        data = {"lab": lab.name, "routing": lab.config.routing, "connections": {}}
        direct = lab.pod("a1").tcp("b1", 8080)
        steps = [direct.open(), direct.send(b"hello"), direct.close()]
        data["connections"]["a1-b1"] = [step_data(s) for s in steps]
        lab.services.add("web", 80, ["b2:8080"])
        svc = lab.pod("a1").tcp("web", 80)
        steps = [svc.open(), svc.send(b"hello"), svc.close()]
        data["connections"]["a1-web"] = [step_data(s) for s in steps]
    finally:
        lab.down()
    with open(out, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
