"""Datapath options of a lab: routing mode, CT lifetimes, map sizes.

The options are fixed when the lab comes up; they become C macros of each
node's BPF program (as Cilium compiles its per-node options in) and show in
``labkit status``. Defaults are the values the cilium-agent uses:

    >>> c = DatapathConfig()
    >>> c.routing, c.timeouts.tcp, c.timeouts.syn, c.timeouts.close
    ('tunnel', 8000, 60, 10)
    >>> DatapathConfig.from_dict(c.to_dict()) == c
    True

Where labkit deliberately differs from Cilium the difference is named in
:data:`LAB_DIFFERENCES`, which ``labkit status`` prints.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from labkit.errors import ConfigError
from labkit.release import DEFAULT_RELEASE, Profile, profile

__all__ = ["CtTimeouts", "DatapathConfig", "ROUTING_MODES", "SOCKET_LB_MODES", "SOCKMAP_MODES", "LB_MODES",
           "NODEPORT_ACCEL_MODES", "NO_BACKEND_RESPONSES", "MAGLEV_TABLE_SIZES", "LAB_DIFFERENCES",
           "VXLAN_PORT", "SERVICE_MODES", "POLICY_MODES"]

ROUTING_MODES = ("tunnel", "native")
#: Socket LB: none; only the nodes' own processes (Cilium's socketLB.hostNamespaceOnly); pods too.
SOCKET_LB_MODES = ("off", "hostns", "full")
#: Socket-level redirect of same-node pod TCP (sock_ops + sk_msg on the sockhash cilium_sock_ops): Cilium
#: 1.4-1.13's --sockops-enable (off by default there too; deprecated in 1.13, removed in 1.14).
SOCKMAP_MODES = ("off", "on")
#: --bpf-lb-mode: how a node forwards outside traffic to a backend on another node.
LB_MODES = ("snat", "dsr", "hybrid")
#: --bpf-lb-acceleration: NodePort/LoadBalancer traffic from outside handled by tc only ('none'), or first by an
#: XDP program on the node's eth0 ('xdp', Cilium's 'native': bpf/bpf_xdp.c)
NODEPORT_ACCEL_MODES = ("none", "xdp")
#: --service-no-backend-response: what a Service without backends does with a packet (Cilium's default: reject)
NO_BACKEND_RESPONSES = ("reject", "drop")
#: Where Services live: the cilium_lb4_* maps, or kube-proxy's iptables on every node.
SERVICE_MODES = ("ebpf", "iptables")
#: --enable-policy: 'default' (an endpoint is enforced once a policy selects it), 'always', 'never'.
#: labkit's default is Cilium's, 'default' (policy code compiled in; the agent decides per endpoint what the map
#: holds, and a pod no policy selects is allowed everything); 'never' compiles no policy code.
POLICY_MODES = ("default", "always", "never")
#: --bpf-lb-maglev-table-size choices (prime); the default is Cilium's, 16381 (251 prints on a screen).
#: --monitor-aggregation values Cilium accepts (pkg/option/monitor.go monitorAggregationOption); the levels
#: themselves: labkit.maps.config.MonitorAggregation.
MONITOR_AGGREGATION_NAMES = ("none", "disabled", "lowest", "low", "medium", "max", "maximum", "0", "1", "2", "3", "4")
MAGLEV_TABLE_SIZES = (251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071)
VXLAN_PORT = 8472  # Cilium's default tunnel port
#: What labkit still does differently from Cilium, on purpose, each with the reason (``labkit status`` prints
#: them). Behaviours that differ between Cilium releases are not here: they are the release profile's
#: (labkit/release.py).
LAB_DIFFERENCES = (
    "CT lifetimes are absolute seconds of CLOCK_MONOTONIC plus a lab clock offset (the labkit_config map), so "
    "that `labkit clock advance` shows a lifetime running out without waiting; on a node the offset is 0",
    "every packet at every hook is reported to a ring buffer (labkit_events), so that a step can show each "
    "packet's whole path; Cilium aggregates trace events (MONITOR_AGGREGATION) and reports a flow again only "
    "after a report interval or a flag change: each record says whether Cilium at the lab's level would have "
    "emitted it, and only those reach the Hubble ring (`labkit observe`)",
    "a pod's from-container hook sends one trace record, for where the packet goes next (to-overlay, to-stack, "
    "to-proxy); Cilium's cil_from_container also sends a from-endpoint trace (TRACE_FROM_LXC, monitor 0) as "
    "each packet enters it, which only aggregation none reports (lowest and low drop every from-* point, medium "
    "and maximum every trace without CT information): at none a node's Hubble shows one FROM_ENDPOINT flow "
    "more per packet a pod sends to another node or the stack than `labkit observe`, and low leaves "
    "FROM_ENDPOINT out too. A packet to a pod of the same node is the exception: its from-container record is "
    "that from-endpoint trace, as on a node",
    "a packet from a pod to a pod of the same node (a hairpin flow too) is routed by the node's kernel from one "
    "veth to the other, where Cilium's from-container hands it straight to the destination endpoint "
    "(ipv4_local_delivery with ENABLE_ROUTING, bpf/lib/l3.h): the packet passes the node's routing and "
    "neighbour tables, so that to-container on the destination's veth is the one program that does a pod's "
    "ingress work whatever the packet's origin; the trace is a node's: one to-endpoint flow per packet "
    "(to-container's), none to-stack",
    "cil_to_overlay and the XDP program keep a record per packet they forward or translate, for the step's "
    "path; Cilium's send drop notifications only, so those records are never reported (`labkit observe` "
    "shows their drops only)",
    "the DNS proxy's L7 flows (Cilium's dns-request/dns-response records from pkg/proxy/dns.go, which Hubble's "
    "parser/seven turns into L7 flows) are not in the Hubble ring: `labkit observe` shows the query's to-proxy "
    "trace and its REDIRECTED policy verdict, and the proxy's own log (`lab.fqdn.resolve`, GET "
    "/v1/fqdn/events) shows each question and answer",
    "`labkit observe -o json` fills each flow as a v1.16 node's Hubble does for the same event "
    "(pkg/hubble/parser/threefour), except: no source_names/destination_names (the names an endpoint looked up "
    "through the DNS proxy: labkit's DNS cache keys answers by endpoint id alone, which repeats across nodes), no "
    "node_labels (a lab's nodes are no Kubernetes Node objects), no egress/ingress_allowed_by or _denied_by on "
    "policy verdicts (the agent keeps no rule labels per policy map entry), ethernet only for frames on a pod's "
    "veth (the endpoint map holds those MACs; the netdev's and the tunnel's frames have none), no ID for the "
    "node's own address (the lab has no host endpoint), and a uuid derived from the ring entry where Cilium "
    "draws a random one (reading the ring twice gives the same flows)",
    "IPv4 fragments are dropped (DROP_FRAG_NOSUPPORT), as Cilium does with --enable-ipv4-fragment-tracking=false "
    "(its default tracks them): lab traffic never fragments, and the datapath stays short enough to read",
    "traffic reaching a node is routed to the pod by the node's kernel, and the CT ingress work Cilium does in "
    "the endpoint's policy program (tail-called from from-overlay/from-netdev) runs at to-container on the pod's "
    "host veth, so that each attach point is one program a learner can read whole, without tail calls; the "
    "packet's arrival through the tunnel (Cilium's CB_FROM_TUNNEL) crosses the routing in skb->mark",
    "a pod reaches its gateway through a permanent neighbour entry for the host veth's MAC, where Cilium's "
    "bpf_lxc answers the pod's ARP: ARP handling would add a path that has nothing to do with conntrack",
    "the node's cilium_host is a veth paired with cilium_net that only holds the pods' gateway address; bpf_host's "
    "from-host/to-host programs are not part of the lab, since no lab traffic starts in a node's own stack "
    "except through socket LB",
    "in dsr mode the backend's node removes the DSR IPv4 option before the pod sees the packet, so that the step "
    "shows where the option is read and consumed, and drops packets to its pods that carry any other IP option "
    "(DROP_INVALID)",
    "dsr dispatch is the IPv4 option in both routing modes, where Cilium wants Geneve dispatch with tunnels: this "
    "lab's kernel has no geneve device, and the option crosses the VXLAN tunnel unchanged",
    "a service uses Maglev when the agent wrote a table for its id into cilium_lb4_maglev (per service, "
    "`--algorithm maglev`), so that one lab can compare both algorithms; Cilium chooses one for every service "
    "with --bpf-lb-algorithm. As in Cilium, only NodePort and LoadBalancer frontends get a table and only the "
    "uplink's programs read it: ClusterIPs have none and pods' traffic always picks at random",
    "the CT garbage collector's interval runs on the lab clock (checked every second), so that `labkit clock "
    "advance` brings the next run forward; Cilium's runs on wall-clock time",
    "with --nodeport-accel xdp the XDP program load-balances the client's requests only; replies (snat mode's "
    "reverse SNAT) stay with tc's from-netdev, where Cilium's XDP program reverse-translates them too; it needs "
    "native routing (it cannot hand a frame to cilium_vxlan), and on the lab's veths an XDP_PASS program on the "
    "fabric side of each node's uplink and complete checksums from ext (labkit/datapath/xdp.py)",
    "socket LB attaches connect4, sendmsg4, recvmsg4 and getpeername4, not bind4/post_bind4: those guard "
    "hostPort and NodePort binds, which no lab process makes; its wildcard lookup of the NodePort surrogate "
    "0.0.0.0:nodePort takes any node's address (ipcache identity host or remote-node), not 127.0.0.0/8 from a "
    "node's namespace nor hostPorts (the lab has none)",
    "the reply of a NodePort flow load-balanced to a pod of the same node is reverse-NATed to the frontend at "
    "to-netdev when it leaves by eth0, and at the pod's from-container only when it goes back through the tunnel "
    "(a pod of another node was the client); Cilium's bpf_lxc does it for every such reply "
    "(CILIUM_CALL_IPV4_NODEPORT_REVNAT), so the step shows the translation one hook later",
    "--service-mode iptables writes what kube-proxy v1.34's iptables proxier writes on such a node "
    "(--detect-local-mode ClusterCIDR with the pods' 198.18.0.0/15, MASQUERADE --random-fully, localhost NodePorts, "
    "nfacct counters; the nodes set nf_conntrack_tcp_be_liberal, because the BPF programs hand replies past the "
    "node's conntrack, so there is no INVALID DROP rule) with its full and partial syncs, but: the first sync is the "
    "first Service change after up or "
    "reset (kube-proxy syncs when it starts), Services come in name order (kube-proxy's follows a map), there is no "
    "kubelet (no KUBE-KUBELET-CANARY) and no healthCheckNodePort (no health-check ACCEPT rule or server for an "
    "externalTrafficPolicy Local LoadBalancer), stale UDP conntrack entries are not cleared, and a Maglev Service "
    "is refused",
    "with policy enforcement on, one program serves every pod of a node, so it finds a pod's policy map (Cilium's "
    "cilium_policy_<id>, compiled into that endpoint's own program) through labkit_policy, a hash of maps keyed by "
    "the endpoint id; a pod with no map there is not enforced (allowed, no verdict reported), where every Cilium "
    "endpoint has a map and an unselected one holds the allow-all entries and reserved:host's ingress allow the "
    "agent writes (`labkit policy get` of an unselected pod says so instead of printing them); likewise the "
    "directions whose verdicts a pod reports (Cilium's POLICY_VERDICT_LOG_FILTER, a constant of the endpoint's "
    "program) are in labkit_policy_filter, endpoint id → filter, which the agent writes with the pod's map (a "
    "pod with a map but no filter reports both directions, the constant's default)",
    "policy verdicts travel in the packet's trace record (the high byte of its flags and its remote_id), not as "
    "separate policy-verdict notifications; the ingress source identity comes from cilium_ipcache even for "
    "packets from the tunnel (Cilium takes the tunnel key's identity; the lab's ipcache holds the same identities); "
    "the verdict ignores auth types, the ICMP fragmentation-needed exception and the tunnel-port "
    "check (no mutual authentication, path MTU discovery or pod-made tunnel traffic in the lab)",
    "the NAT map translates TCP and UDP only: an ICMP error about a flow the LB node SNATed (a backend's "
    "fragmentation-needed, say) reaches that node with its inner header untranslated, and ICMP echo ids are "
    "not NATed, where Cilium's snat_v4_nat/snat_v4_rev_nat translate both (bpf/tests/bpf_nat_tests.c); lab "
    "traffic through SNAT is TCP and UDP, and path MTU discovery never runs on the lab's veths",
    "the only L7 proxy is the DNS proxy, one thread per node in the agent with its socket in the node's "
    "namespace on the fixed port 10053 (Cilium's is in the host, its port OS-assigned unless --tofqdns-proxy-port); "
    "pods' packets reach it only the --enable-bpf-tproxy way (bpf_sk_assign from bpf_lxc, plus Cilium's fwmark "
    "0x200 rule to table 2004), UDP only, and it forwards from the node's address where Cilium's transparent mode "
    "keeps the pod's; its DNS cache runs on the lab clock, so `labkit clock advance` expires answers, and keeps no "
    "zombies (IPs of expired names stay in Cilium's maps while a connection uses them)",
    "`up --sockmap on` is the socket-level redirect Cilium shipped as a beta from 1.4 to 1.13 (--sockops-enable, "
    "bpf/sockops/: sock_ops fills the sockhash cilium_sock_ops, sk_msg redirects sends to the peer socket); 1.13 "
    "deprecated it and 1.14 removed it as unmaintained (cilium/cilium#23556, #23606), so no release the lab "
    "reproduces has it. The lab's sock_ops program sits on the pods' cgroups (Cilium's on the root cgroup) and "
    "skips 1.13's L7-proxy branch and the per-send policy lookup of its sk_msg program: policy applies to the "
    "handshake, which still crosses the tc hooks",
)


@dataclass(frozen=True)
class CtTimeouts:
    """CT lifetimes in seconds, named after the cilium-agent flags that set them."""

    tcp: int = 8000  #: --bpf-ct-timeout-regular-tcp → CT_CONNECTION_LIFETIME_TCP
    any: int = 60  #: --bpf-ct-timeout-regular-any → CT_CONNECTION_LIFETIME_NONTCP
    svc_tcp: int = 8000  #: --bpf-ct-timeout-service-tcp → CT_SERVICE_LIFETIME_TCP
    svc_any: int = 60  #: --bpf-ct-timeout-service-any → CT_SERVICE_LIFETIME_NONTCP
    svc_tcp_grace: int = 60  #: --bpf-ct-timeout-service-tcp-grace → CT_SERVICE_CLOSE_REBALANCE
    syn: int = 60  #: --bpf-ct-timeout-regular-tcp-syn → CT_SYN_TIMEOUT
    close: int = 10  #: --bpf-ct-timeout-regular-tcp-fin → CT_CLOSE_TIMEOUT

    MACROS = {
        "tcp": "CT_CONNECTION_LIFETIME_TCP",
        "any": "CT_CONNECTION_LIFETIME_NONTCP",
        "svc_tcp": "CT_SERVICE_LIFETIME_TCP",
        "svc_any": "CT_SERVICE_LIFETIME_NONTCP",
        "svc_tcp_grace": "CT_SERVICE_CLOSE_REBALANCE",
        "syn": "CT_SYN_TIMEOUT",
        "close": "CT_CLOSE_TIMEOUT",
    }

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 2**31:
                raise ConfigError(f"CT timeout '{f.name}': expected whole seconds from 1 to 2^31, got {value!r}")

    def macros(self) -> dict[str, int]:
        """``{C macro: seconds}`` for the BPF build."""
        return {self.MACROS[f.name]: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class DatapathConfig:
    """Options fixed at ``labkit up``; each becomes a macro of the node programs."""

    routing: str = "tunnel"
    #: hostns by default, so pods take the per-packet path the deep dive explains (Cilium's default is full)
    socket_lb: str = "hostns"
    timeouts: CtTimeouts = field(default_factory=CtTimeouts)
    ct_tcp_size: int = 524288  #: cilium_ct4_global max entries (Cilium's default)
    ct_any_size: int = 262144  #: cilium_ct_any4_global max entries (Cilium's default)
    lb_map_size: int = 65536  #: max entries of each cilium_lb4_* map (Cilium's --bpf-lb-map-max)
    lb_mode: str = "dsr"  #: --bpf-lb-mode: snat, dsr or hybrid (DSR for TCP, SNAT for UDP)
    maglev_table_size: int = 16381  #: --bpf-lb-maglev-table-size, Cilium's default (pass 251 for a printable table)
    gc_timer: bool = True  #: the CT garbage collector's timer starts on (labkit/gc.py; `labkit gc timer`)
    #: 'ebpf': Services in the cilium_lb4_* maps; 'iptables': kube-proxy's nat table on every node instead
    service_mode: str = "ebpf"
    #: the Cilium release whose behaviour the lab reproduces (labkit/release.py)
    cilium: str = DEFAULT_RELEASE
    #: count packets and bytes per CT entry (CONNTRACK_ACCOUNTING; the agent's --bpf-conntrack-accounting,
    #: off by default, so a node prints Packets=0 Bytes=0)
    ct_accounting: bool = False
    #: network policy enforcement (--enable-policy): 'default' (Cilium's default, a node's) and 'always' compile it
    #: in (ENABLE_POLICY), and what a pod's map holds is the agent's business; 'never' compiles no policy code
    policy: str = "default"
    #: --policy-audit-mode: a packet policy would drop passes, its verdict marked audited (POLICY_AUDIT_MODE)
    policy_audit: bool = False
    #: --monitor-aggregation: none, lowest, low, medium (the default, as on a node) or maximum. Not a macro:
    #: the level lives in labkit_config, so ``Lab.monitor_aggregation()`` changes it without a rebuild
    monitor_aggregation: str = "medium"
    #: pages of each node's labkit_events ring buffer (a power of two; 256 pages = 1 MiB)
    events_ring_pages: int = 256
    #: flows the lab's Hubble ring keeps (--hubble-event-buffer-capacity: 2^n-1, default 4095)
    hubble_buffer_size: int = 4095
    #: socket-level redirect between pods of one node ('on': bpf_sockops.c and bpf_redir.c, ENABLE_SOCKMAP)
    sockmap: str = "off"
    #: --bpf-lb-acceleration: 'none' (tc only) or 'xdp' (bpf_xdp.c on each node's eth0, ENABLE_NODEPORT_ACCELERATION)
    nodeport_accel: str = "none"
    #: --service-no-backend-response: 'reject' (Cilium's default) answers ICMP port unreachable, 'drop' drops with
    #: DROP_NO_SERVICE (SERVICE_NO_BACKEND_DROP)
    no_backend_response: str = "reject"

    def __post_init__(self) -> None:
        if self.routing not in ROUTING_MODES:
            raise ConfigError(f"routing mode: expected one of {', '.join(ROUTING_MODES)}, got {self.routing!r}")
        if self.socket_lb not in SOCKET_LB_MODES:
            raise ConfigError(f"socket LB: expected one of {', '.join(SOCKET_LB_MODES)}, got {self.socket_lb!r}")
        if self.sockmap not in SOCKMAP_MODES:
            raise ConfigError(f"sockmap: expected one of {', '.join(SOCKMAP_MODES)}, got {self.sockmap!r}")
        if self.lb_mode not in LB_MODES:
            raise ConfigError(f"LB mode: expected one of {', '.join(LB_MODES)}, got {self.lb_mode!r}")
        if self.maglev_table_size not in MAGLEV_TABLE_SIZES or isinstance(self.maglev_table_size, bool):
            raise ConfigError(f"Maglev table size: expected one of {', '.join(map(str, MAGLEV_TABLE_SIZES))}, "
                              f"got {self.maglev_table_size!r}")
        if self.service_mode not in SERVICE_MODES:
            raise ConfigError(f"service mode: expected ebpf or iptables, got {self.service_mode!r}")
        if self.policy not in POLICY_MODES:
            raise ConfigError(f"policy enforcement: expected one of {', '.join(POLICY_MODES)}, got {self.policy!r}")
        for name in ("gc_timer", "ct_accounting", "policy_audit"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}: expected True or False, got {getattr(self, name)!r}")
        if self.policy_audit and self.policy == "never":
            raise ConfigError("policy_audit: expected policy 'default' or 'always' (audit mode audits policy "
                              "verdicts), got policy 'never'")
        if self.nodeport_accel not in NODEPORT_ACCEL_MODES:
            raise ConfigError(f"NodePort acceleration: expected one of {', '.join(NODEPORT_ACCEL_MODES)}, "
                              f"got {self.nodeport_accel!r}")
        if self.no_backend_response not in NO_BACKEND_RESPONSES:
            raise ConfigError(f"service no-backend response: expected one of {', '.join(NO_BACKEND_RESPONSES)}, "
                              f"got {self.no_backend_response!r}")
        if self.nodeport_accel == "xdp" and (self.routing != "native" or self.service_mode != "ebpf"):
            # labkit's XDP program forwards with XDP_TX only: it cannot hand a frame to cilium_vxlan with a
            # tunnel key, and kube-proxy's Services are not in the cilium_lb4_* maps it reads.
            raise ConfigError(f"NodePort acceleration 'xdp': expected routing 'native' and service mode 'ebpf', "
                              f"got routing {self.routing!r} and service mode {self.service_mode!r}")
        profile(self.cilium)  # ConfigError names the releases
        if str(self.monitor_aggregation).lower() not in MONITOR_AGGREGATION_NAMES:
            raise ConfigError(f"monitor aggregation level {self.monitor_aggregation!r}: expected one of none, lowest, "
                              f"low, medium, maximum or 0-4")
        pages = self.events_ring_pages
        if isinstance(pages, bool) or not isinstance(pages, int) or pages < 1 or pages & (pages - 1) or pages > 65536:
            raise ConfigError(f"events_ring_pages: expected a power of two from 1 to 65536, got {pages!r}")
        size = self.hubble_buffer_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1 or (size + 1) & size or size > 65535:
            raise ConfigError(f"hubble_buffer_size: expected 2^n-1 (1, 3, 7, ... 4095, ... 65535), got {size!r}")
        for name in ("ct_tcp_size", "ct_any_size", "lb_map_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 16 <= value <= 16_777_216:
                raise ConfigError(f"{name}: expected 16 to 16777216 entries, got {value!r}")

    @property
    def profile(self) -> Profile:
        """The Cilium release profile: which release's behaviour the datapath and the views follow."""
        return profile(self.cilium)

    def with_options(self, **changes) -> "DatapathConfig":
        """A copy with some options changed; ``timeouts`` may be a dict of changed lifetimes.

        >>> DatapathConfig().with_options(routing="native", timeouts={"syn": 5}).timeouts.syn
        5
        """
        if isinstance(changes.get("timeouts"), dict):
            _check_timeout_names(changes["timeouts"])
            changes["timeouts"] = replace(self.timeouts, **changes["timeouts"])
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"datapath options: unknown {sorted(unknown)}; expected some of {sorted(f.name for f in fields(self))}")
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain data for the state file and ``status --json``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DatapathConfig":
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        data = dict(data)
        timeouts = dict(data.pop("timeouts", {}))
        _check_timeout_names(timeouts)
        timeouts = CtTimeouts(**timeouts)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"datapath options: unknown {sorted(unknown)}; expected some of {sorted(known)}")
        return cls(timeouts=timeouts, **data)


def _check_timeout_names(timeouts: dict) -> None:
    known = sorted(f.name for f in fields(CtTimeouts))
    unknown = set(timeouts) - set(known)
    if unknown:
        raise ConfigError(f"CT timeouts: unknown {sorted(unknown)}; expected some of {known}")
