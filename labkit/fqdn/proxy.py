"""The agent's DNS proxy: one thread per node, its socket in the node's namespace on
:data:`~labkit.policy.resolve.DNS_PROXY_PORT` (Cilium v1.16 pkg/fqdn/dnsproxy, started by
daemon/cmd/fqdn.go bootstrapFQDN; one proxy per node, in the agent).

How a query gets here: the pod's policy has an egress ``toPorts`` item with ``rules.dns``, so
the policy map's entry for the resolver's port carries the proxy port; bpf_lxc.c assigns the
packet to this socket (bpf/lib/proxy.h: bpf_sk_assign, the BPF-TPROXY way) and the node's
fwmark rule delivers it locally. The socket is ``IP_TRANSPARENT`` and asks for
``IP_RECVORIGDSTADDR``, so each datagram comes with the address the pod sent it to.

What happens to it (pkg/fqdn/dnsproxy/proxy.go ServeDNS, daemon/cmd/fqdn.go notifyOnDNSMsg):

1. the query's name is checked against the DNS rules of the policies that select the pod
   (:meth:`labkit.agent.policies.Policies.dns_allowed`); a name they do not allow is answered
   REFUSED by the proxy itself (``--tofqdns-dns-reject-response-code``, default ``refused``)
   and never reaches the server;
2. an allowed query is sent on to the address the pod asked (dnsmasq in ext). Cilium's
   transparent mode (``--dnsproxy-enable-transparent-mode``) sends it from the pod's own address;
   labkit sends it from the node's, which the server sees in its log;
3. the answer's A records go to the agent (:meth:`~labkit.agent.policies.Policies.learn_dns`): the
   DNS cache, the FQDN identities, every endpoint's policy map and the ipcache are written;
4. only then is the answer released to the pod — or after the max delay, whichever comes
   first (``--tofqdns-proxy-response-max-delay``, default 100 ms; Cilium logs "Timed out waiting for
   datapath updates of FQDN IP information; returning response" and sends it anyway). The answer
   leaves from a socket bound (``IP_TRANSPARENT``) to the address and port the pod asked, so the
   pod's CT entry sees it as the reply of its query.

Every step is an event (:attr:`DnsProxies.events`, ``GET /v1/fqdn/events``) with a monotonic time
stamp, so a test or a learner can see the answer was held until the maps were written.
"""
from __future__ import annotations

import collections
import select
import socket
import struct
import sys
import threading
import time

from labkit.fqdn import dns
from labkit.net import netns as _netns
from labkit.policy.resolve import DNS_PROXY_PORT

__all__ = ["DnsProxies", "MAX_DELAY", "FORWARD_TIMEOUT"]

#: --tofqdns-proxy-response-max-delay (v1.16 default 100 ms).
MAX_DELAY = 0.1
#: How long the proxy waits for the server (Cilium's dnsproxy client: 10 s per exchange; shorter here).
FORWARD_TIMEOUT = 2.0
_IP_TRANSPARENT, _IP_RECVORIGDSTADDR = 19, 20  # linux/in.h (IP_ORIGDSTADDR is the cmsg type, 20)


def _orig_dst(ancdata) -> tuple[str, int] | None:
    for level, kind, data in ancdata:
        if level == socket.SOL_IP and kind == _IP_RECVORIGDSTADDR and len(data) >= 8:
            port, = struct.unpack_from("!H", data, 2)
            return socket.inet_ntoa(data[4:8]), port
    return None


class DnsProxies:
    """The DNS proxy of every node of ``agent``'s lab (threads started by :meth:`start`)."""

    def __init__(self, agent, port: int = DNS_PROXY_PORT, max_delay: float = MAX_DELAY):
        self.agent = agent
        self.port = port
        self.max_delay = max_delay
        self.events: collections.deque = collections.deque(maxlen=512)
        self.errors: dict[str, str] = {}
        self.ready: dict[str, threading.Event] = {}
        self._seq = 0
        self._seq_lock = threading.Lock()

    def _event(self, qid: int, kind: str, **fields) -> None:
        self.events.append({"t_ns": time.monotonic_ns(), "query": qid, "event": kind, **fields})

    def start(self, stopping: threading.Event) -> list[threading.Thread]:
        threads = []
        for n in self.agent.view.topology.nodes:
            self.ready[n.name] = threading.Event()
            t = threading.Thread(target=self._serve, args=(n.name, stopping), name=f"dnsproxy-{n.name}", daemon=True)
            t.start()
            threads.append(t)
        return threads

    # -- one node ---------------------------------------------------------------------
    def _serve(self, node: str, stopping: threading.Event) -> None:
        netns = self.agent.view.topology.netns(node)
        try:
            with _netns.entered(netns):  # this thread, and the workers it starts, stay in the node
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.setsockopt(socket.SOL_IP, _IP_TRANSPARENT, 1)
                sock.setsockopt(socket.SOL_IP, _IP_RECVORIGDSTADDR, 1)
                sock.bind(("0.0.0.0", self.port))
                self.ready[node].set()
                with sock:
                    while not stopping.is_set():
                        if not select.select([sock], [], [], 0.2)[0]:
                            continue
                        data, anc, _, src = sock.recvmsg(4096, socket.CMSG_SPACE(16))
                        dst = _orig_dst(anc)
                        if dst is None:
                            continue
                        threading.Thread(target=self._handle, args=(node, data, src, dst), daemon=True,
                                         name=f"dnsproxy-{node}-query").start()
        except Exception as exc:  # the agent goes on without this node's proxy; health says why
            self.errors[node] = f"{type(exc).__name__}: {exc}"
            print(f"labkit agent: dns proxy on {node}: {self.errors[node]}", file=sys.stderr, flush=True)

    def _handle(self, node: str, query: bytes, src: tuple[str, int], dst: tuple[str, int]) -> None:
        with self._seq_lock:
            self._seq += 1
            qid = self._seq
        try:
            self._answer(qid, node, query, src, dst)
        except Exception as exc:
            self._event(qid, "error", error=f"{type(exc).__name__}: {exc}")
            print(f"labkit agent: dns proxy on {node}: query from {src[0]}:{src[1]}: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)

    def _answer(self, qid: int, node: str, query: bytes, src: tuple[str, int], dst: tuple[str, int]) -> None:
        q = dns.parse(query)
        name = q.question.name
        with self.agent.lock:
            pols = self.agent.policies
            ref = pols.dns_endpoint(src[0])
            allowed = ref is not None and pols.dns_allowed(ref, name, dst[1])
        self._event(qid, "query", node=node, pod=ref.pod if ref else None, name=name, src=f"{src[0]}:{src[1]}",
                    dst=f"{dst[0]}:{dst[1]}", allowed=allowed)
        if not allowed:
            self._send(dns.refused(query), src, dst)
            self._event(qid, "refused", name=name)
            return
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as up:
            up.settimeout(FORWARD_TIMEOUT)
            up.connect(dst)
            up.send(query)
            answer = up.recv(4096)
        reply = dns.parse(answer)
        records = reply.a_records()
        self._event(qid, "answer", name=name, rcode=reply.rcode, records=records)
        t0 = time.monotonic()
        if records and reply.rcode == dns.RCODE_NOERROR and "dns-release-early" in self.agent.view.agent_faults():
            # break-it fault (lab 11): the answer leaves before the maps hold its addresses
            self._release(qid, name, answer, src, dst, t0)
            with self.agent.lock:
                report = self.agent.policies.learn_dns(ref, name, records)
            self._event(qid, "maps-written", name=name, changed=report.get("changed"), error=None)
            return
        if records and reply.rcode == dns.RCODE_NOERROR:
            done: dict = {}

            def learn() -> None:
                try:
                    with self.agent.lock:
                        done["report"] = self.agent.policies.learn_dns(ref, name, records)
                except Exception as exc:
                    done["error"] = f"{type(exc).__name__}: {exc}"
                self._event(qid, "maps-written", name=name, changed=done.get("report", {}).get("changed"),
                            error=done.get("error"))

            worker = threading.Thread(target=learn, daemon=True, name=f"dnsproxy-{node}-learn")
            worker.start()
            worker.join(self.max_delay)
            if worker.is_alive():
                self._event(qid, "max-delay", name=name, waited_ms=round((time.monotonic() - t0) * 1000, 3))
        self._release(qid, name, answer, src, dst, t0)

    def _release(self, qid: int, name: str, answer: bytes, src: tuple[str, int], dst: tuple[str, int],
                 t0: float) -> None:
        """Send the answer to the pod; the event is stamped as it leaves."""
        self._send(answer, src, dst)
        self._event(qid, "released", name=name, held_ms=round((time.monotonic() - t0) * 1000, 3))

    @staticmethod
    def _send(payload: bytes, to: tuple[str, int], as_from: tuple[str, int]) -> None:
        """Send from the address the pod asked (not the node's): the reply of the pod's CT entry."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.setsockopt(socket.SOL_IP, _IP_TRANSPARENT, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(as_from)
            s.sendto(payload, to)
