"""``make bench``'s XDP section: packets per second node-a forwards and drops for a UDP flood from ``ext``, with its
NodePort path in tc (``--nodeport-accel none``) and in XDP (``--nodeport-accel xdp``), two labs side by side.

    from labkit.tools.xdpbench import xdp_vs_tc, report_lines
    print("\\n".join(report_lines(xdp_vs_tc(rounds=5))))

Each round floods each lab in turn (alternating, so a busy machine hurts both alike) for ``FLOOD_SECONDS`` with
fixed-size UDP datagrams from a Python socket loop in ``ext`` (its own rate is stated: on a shared machine the
sender, not the node, may be what limits the figure):

- forward: to node-a's NodePort, backend b1 on node-b (dsr: the option is added on node-a and the frame sent
  straight back out of eth0, XDP_TX or tc's bpf_redirect_neigh); counted at the receiver, node-b's eth0 RX.
- drop: to a LoadBalancer VIP without backends, the labs built with ``--service-no-backend-response drop`` (the
  default, reject, would answer each datagram), so each is dropped (DROP_NO_SERVICE); counted by the kernel where
  the drop happened:
  node-a eth0's XDP drop counter (``ethtool -S eth0``: rx_queue_N_xdp_drops) and its clsact qdisc's drops
  (``tc -s qdisc show dev eth0``: a tc program's TC_ACT_SHOT). With XDP the qdisc counts none: the frame never
  became an skb of node-a.

Tracing is off in both labs (trace mode 'none'), so only the datapath is measured.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

from labkit.config import DatapathConfig
from labkit.lab import Lab

__all__ = ["xdp_vs_tc", "report_lines", "XDP_LABS", "FLOOD_SECONDS", "PAYLOAD"]

#: The two labs: the same native-routing dsr lab, NodePort in tc or in XDP.
XDP_LABS = {"tc": "bench-xtc", "xdp": "bench-xxdp"}
FLOOD_SECONDS = 2.0
PAYLOAD = 64  #: UDP payload bytes: 106-byte frames (14 Ethernet + 20 IPv4 + 8 UDP + 64)
NODE_PORT = 30090
_FLOOD = r"""
import socket, sys, time
dst, port, secs, size = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((dst, port))
data, sent, refused = b"x" * size, 0, 0
t0 = time.perf_counter()
end = t0 + secs
while time.perf_counter() < end:
    for _ in range(200):
        try:
            s.send(data)
            sent += 1
        except OSError:
            refused += 1
print(sent, refused, time.perf_counter() - t0)
"""


def _rx_packets(lab, node: str) -> int:
    """eth0's RX packet counter in ``node`` (``ip -s link show eth0``)."""
    out = lab.exec(node, ["ip", "-j", "-s", "link", "show", "eth0"], check=True).stdout
    return int(json.loads(out)[0]["stats64"]["rx"]["packets"])


def _drops(lab, node: str) -> dict:
    """node's eth0 drops: by its XDP program (``ethtool -S``) and by its tc ingress program (the clsact qdisc)."""
    stats = lab.exec(node, ["ethtool", "-S", "eth0"], check=True).stdout
    xdp = sum(int(line.split(":")[1]) for line in stats.splitlines() if "_xdp_drops:" in line)
    qdiscs = json.loads(lab.exec(node, ["tc", "-s", "-j", "qdisc", "show", "dev", "eth0"], check=True).stdout)
    tc = sum(q.get("drops", 0) for q in qdiscs if q.get("kind") == "clsact")
    return {"xdp": xdp, "tc": tc}


def _flood(lab, target: str, port: int) -> tuple[int, float]:
    """Flood ``target:port`` from ext; (datagrams sent, seconds)."""
    out = lab.exec("ext", [sys.executable, "-c", _FLOOD, target, str(port), str(FLOOD_SECONDS), str(PAYLOAD)],
                   check=True, timeout=FLOOD_SECONDS + 60).stdout.split()
    return int(out[0]), float(out[2])


def _round(lab, node_a_ip: str, void_vip: str) -> dict:
    before = _rx_packets(lab, "node-b")
    sent, secs = _flood(lab, node_a_ip, NODE_PORT)
    time.sleep(0.2)  # let node-b's backlog drain into the counter
    fwd = {"sent_pps": sent / secs, "forwarded_pps": (_rx_packets(lab, "node-b") - before) / secs}
    d0 = _drops(lab, "node-a")
    sent, secs = _flood(lab, void_vip, 53)
    time.sleep(0.2)
    d1 = _drops(lab, "node-a")
    return {**fwd, "drop_sent_pps": sent / secs, "dropped_xdp_pps": (d1["xdp"] - d0["xdp"]) / secs,
            "dropped_tc_pps": (d1["tc"] - d0["tc"]) / secs}


def xdp_vs_tc(rounds: int) -> dict:
    """Both labs up at once, ``rounds`` alternating rounds; medians and every sample (packets per second)."""
    labs = {}
    try:
        for mode, name in XDP_LABS.items():
            Lab.cleanup(name)
            labs[mode] = Lab.up(name, config=DatapathConfig(routing="native", lb_mode="dsr", gc_timer=False,
                                                            no_backend_response="drop",
                                                            nodeport_accel="none" if mode == "tc" else "xdp"))
            labs[mode].services.add("flood", 8080, ["b1:8080"], protocol="UDP", type="NodePort", node_port=NODE_PORT)
            labs[mode].services.add("void", 53, [], protocol="UDP", type="LoadBalancer")
            labs[mode].trace_mode("none")
        node_a = next(iter(labs.values())).topology.node("node-a").ip
        vips = {mode: lab.services.get("void").lb_vip for mode, lab in labs.items()}
        samples: dict[str, dict[str, list[float]]] = {mode: {} for mode in labs}
        for _ in range(rounds):
            for mode, lab in labs.items():
                for key, value in _round(lab, node_a, vips[mode]).items():
                    samples[mode].setdefault(key, []).append(value)
    finally:
        for name in XDP_LABS.values():
            Lab.cleanup(name)
    medians = {mode: {k: round(statistics.median(v)) for k, v in s.items()} for mode, s in samples.items()}
    return {"rounds": rounds, "seconds": FLOOD_SECONDS, "payload": PAYLOAD, "frame": PAYLOAD + 42,
            "median_pps": medians, "samples_pps": {m: {k: [round(x) for x in v] for k, v in s.items()}
                                                   for m, s in samples.items()},
            "kernel": platform.release(), "cpus": os.cpu_count()}


def report_lines(r: dict) -> list[str]:
    """The report's lines for :func:`xdp_vs_tc`."""
    m = r["median_pps"]
    lines = [f"NodePort in tc vs XDP (`--nodeport-accel`), UDP flood from ext, {r['frame']}-byte frames, "
             f"{r['seconds']:g} s per flood, medians of {r['rounds']} alternating rounds, two labs side by side "
             f"(native routing, dsr, tracing off; kernel {r['kernel']}, {r['cpus']} CPUs shared by sender, nodes "
             f"and receiver):",
             "| flood | sender (ext, Python UDP loop) | tc | XDP |", "|---|---|---|---|"]
    lines.append(f"| NodePort, backend on node-b: forwarded (node-b eth0 RX) | {m['tc']['sent_pps']:,} / "
                 f"{m['xdp']['sent_pps']:,} pkt/s | {m['tc']['forwarded_pps']:,} pkt/s | "
                 f"{m['xdp']['forwarded_pps']:,} pkt/s |")
    lines.append(f"| LB VIP without backends: dropped on node-a (where) | {m['tc']['drop_sent_pps']:,} / "
                 f"{m['xdp']['drop_sent_pps']:,} pkt/s | {m['tc']['dropped_tc_pps'] + m['tc']['dropped_xdp_pps']:,}"
                 f" pkt/s (tc {m['tc']['dropped_tc_pps']:,}) | "
                 f"{m['xdp']['dropped_tc_pps'] + m['xdp']['dropped_xdp_pps']:,} pkt/s (XDP "
                 f"{m['xdp']['dropped_xdp_pps']:,}, tc {m['xdp']['dropped_tc_pps']:,}) |")
    return lines
