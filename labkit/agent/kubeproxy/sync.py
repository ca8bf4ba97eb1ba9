"""How kube-proxy gets its rules into a node: ``syncProxyRules``'s full and partial
syncs, its ``CleanupLeftovers``, and the node's iptables behind them (the real one in
the node's namespace, or an in-memory one for examples and tests).

A **full** sync first does what kube-proxy does at start and after its canary
chain disappeared: it sets ``route_localnet`` (and the lab sets
``nf_conntrack_tcp_be_liberal``, see :func:`setup`), creates the ``KUBE-PROXY-CANARY``
chains in mangle, nat and filter, makes sure every jump from a built-in chain
exists (``iptables -C``, else ``iptables -I``: prepended, so the last one ensured
comes first), and creates the nfacct counters; then it restores every chain. A
**partial** sync restores the top-level chains and only the changed services' chains.
Both read ``iptables-save -t nat`` first, to delete stale service chains with ``-X``,
and both load with ``iptables-restore --noflush --counters``: chains a restore does
not name keep their rules and their counters.

When is a sync full? When the caller asks (``changed=None``), or when the nat
table has no ``KUBE-PROXY-CANARY`` chain: the node was never synced since ``up``,
or ``reset`` cleaned kube-proxy's chains away (:func:`cleanup`), or someone deleted
them. That is kube-proxy's own signal (its iptables Monitor forces a full sync when
the canary is gone).

    >>> from labkit.agent.services import Services
    >>> from labkit.net.topology import Topology
    >>> topo = Topology.default("demo")
    >>> svcs = Services.in_memory(topo)
    >>> ipt = MemoryIptables()
    >>> sync(ipt, [svcs.add("web", 80, ["b1:8080"])], topo, "node-a", changed={"web"}).full
    True
    >>> sync(ipt, svcs.list(), topo, "node-a", changed=set()).full
    False
    >>> [line for line in ipt.save("nat").splitlines() if line.startswith("-A PREROUTING")]
    ['-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES']
"""
from __future__ import annotations

import functools
import re
import subprocess
from dataclasses import dataclass, field, replace
from typing import Iterable, Protocol

from labkit.agent.kubeproxy import _nfacct
from labkit.errors import DatapathError
from labkit.net import netns as _netns
from labkit.net.topology import Topology
from labkit.agent.kubeproxy.names import is_service_chain
from labkit.agent.kubeproxy.rules import NFACCT_INVALID, NFACCT_LOCALHOST, NodeOptions, Restore, chain_line, render
from labkit.agent.kubeproxy.text import chains_in

__all__ = ["CANARY", "Jump", "JUMPS", "KUBELET_JUMPS", "jumps_into", "Iptables", "MemoryIptables", "MemoryTables",
           "NetnsIptables", "sync", "setup", "cleanup", "chains_in", "restore", "restore_noflush", "NODE_SYSCTLS",
           "nat_table", "partial_table"]

CANARY = "KUBE-PROXY-CANARY"
CANARY_TABLES = ("mangle", "nat", "filter")
_NEW = ("-m", "conntrack", "--ctstate", "NEW")


def _args_text(args: list[str]) -> str:
    """Arguments as restore text: one with a space is quoted, as kube-proxy quotes its comments."""
    return " ".join(f'"{a}"' if " " in a else a for a in args)


@dataclass(frozen=True)
class Jump:
    """One entry of iptablesJumpChains: a rule in a built-in chain that sends packets to a kube-proxy chain."""

    table: str
    chain: str  #: where it jumps (dstChain)
    into: str  #: the built-in chain holding the rule (srcChain)
    comment: str = ""
    extra: tuple = ()

    def args(self) -> list[str]:
        """The rule's arguments, as EnsureRule gets them (extra args, comment, jump)."""
        comment = ["-m", "comment", "--comment", self.comment] if self.comment else []
        return [*self.extra, *comment, "-j", self.chain]

    def rule(self) -> str:
        """``-A INPUT ...`` as restore text (the comment quoted)."""
        return f"-A {self.into} {_args_text(self.args())}"


#: iptablesJumpChains, in kube-proxy's order
JUMPS = (
    Jump("filter", "KUBE-EXTERNAL-SERVICES", "INPUT", "kubernetes externally-visible service portals", _NEW),
    Jump("filter", "KUBE-EXTERNAL-SERVICES", "FORWARD", "kubernetes externally-visible service portals", _NEW),
    Jump("filter", "KUBE-NODEPORTS", "INPUT", "kubernetes health check service ports"),
    Jump("filter", "KUBE-SERVICES", "FORWARD", "kubernetes service portals", _NEW),
    Jump("filter", "KUBE-SERVICES", "OUTPUT", "kubernetes service portals", _NEW),
    Jump("filter", "KUBE-FORWARD", "FORWARD", "kubernetes forwarding rules"),
    Jump("filter", "KUBE-PROXY-FIREWALL", "INPUT", "kubernetes load balancer firewall", _NEW),
    Jump("filter", "KUBE-PROXY-FIREWALL", "OUTPUT", "kubernetes load balancer firewall", _NEW),
    Jump("filter", "KUBE-PROXY-FIREWALL", "FORWARD", "kubernetes load balancer firewall", _NEW),
    Jump("nat", "KUBE-SERVICES", "OUTPUT", "kubernetes service portals"),
    Jump("nat", "KUBE-SERVICES", "PREROUTING", "kubernetes service portals"),
    Jump("nat", "KUBE-POSTROUTING", "POSTROUTING", "kubernetes postrouting rules"),
)
#: iptablesKubeletJumpChains: kube-proxy's copy of kubelet's KUBE-FIREWALL (never removed by cleanup)
KUBELET_JUMPS = (Jump("filter", "KUBE-FIREWALL", "INPUT"), Jump("filter", "KUBE-FIREWALL", "OUTPUT"))
#: CleanupLeftovers: the chains it flushes and deletes besides the service chains
_CLEANUP = {"nat": ("KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ", CANARY),
            "filter": ("KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS",
                       "KUBE-PROXY-FIREWALL", CANARY)}


def jumps_into(table: str) -> list[Jump]:
    """The jumps in ``table`` in the order a full sync leaves them in each built-in chain (each was
    prepended, so the last ensured comes first)."""
    return [j for j in reversed(JUMPS + KUBELET_JUMPS) if j.table == table]


class Iptables(Protocol):
    """One node's iptables, as kube-proxy's utiliptables.Interface sees it (plus what it probes at start)."""

    def save(self, table: str) -> str: ...
    def restore_all(self, text: str) -> None: ...
    def ensure_chain(self, table: str, chain: str) -> None: ...
    def ensure_rule(self, table: str, chain: str, args: list[str]) -> None: ...
    def delete_rule(self, table: str, chain: str, args: list[str]) -> None: ...
    def delete_chain(self, table: str, chain: str) -> None: ...
    def node_sysctls(self) -> None: ...
    def options(self) -> NodeOptions: ...


#: the node's sysctls before kube-proxy reads them: route_localnet is kube-proxy's own (NewProxier, with
#: --iptables-localhost-nodeports); tcp_be_liberal is the lab's: its BPF programs hand a pod's replies
#: straight to the tunnel or the pod, past the node's netfilter, so node conntrack sees half of a
#: handshake and would call the rest INVALID, which kube-proxy's KUBE-FORWARD drops unless it is set
NODE_SYSCTLS = {"net.ipv4.conf.all.route_localnet": 1, "net.netfilter.nf_conntrack_tcp_be_liberal": 1}


def setup(ipt: Iptables) -> None:
    """What a full sync does before its restore: the node's sysctls, canaries, the jump rules (the nfacct
    counters come with :meth:`Iptables.options`)."""
    ipt.node_sysctls()
    for table in CANARY_TABLES:  # ipt.Monitor creates them
        ipt.ensure_chain(table, CANARY)
    for jump in JUMPS + KUBELET_JUMPS:
        ipt.ensure_chain(jump.table, jump.chain)
        ipt.ensure_rule(jump.table, jump.into, jump.args())


def sync(ipt: Iptables, services: Iterable, topology: Topology, node: str, changed: set | None = None,
         faults: Iterable[str] = ()) -> Restore:
    """One syncProxyRules on ``node``: full if ``changed`` is None or the canary is gone, else partial
    (the top-level chains, plus the chains of the services named in ``changed``). ``faults``: the lab's
    agent faults (``kp-no-masq`` leaves out the hairpin KUBE-MARK-MASQ rule)."""
    existing = chains_in(ipt.save("nat"))
    full = changed is None or CANARY not in existing
    if full:
        setup(ipt)
    options = ipt.options()
    if "kp-no-masq" in faults:
        options = replace(options, self_masq=False)
    restore = render(services, topology, node, options, None if full else set(changed), existing)
    ipt.restore_all(restore.text)
    return restore


def cleanup(ipt: Iptables) -> None:
    """CleanupLeftovers (``kube-proxy --cleanup``): unlink and delete kube-proxy's chains and canaries,
    keeping its KUBE-FIREWALL copy. The next sync finds no canary and is full."""
    for jump in JUMPS:
        ipt.delete_rule(jump.table, jump.into, jump.args())
    for table, chains in _CLEANUP.items():
        existing = chains_in(ipt.save(table))
        gone = [c for c in chains if c in existing] + sorted(c for c in existing if is_service_chain(c))
        if gone:
            lines = [f"*{table}"] + [f":{c} - [0:0]" for c in gone] + [f"-X {c}" for c in gone] + ["COMMIT"]
            ipt.restore_all("\n".join(lines) + "\n")
    ipt.delete_chain("mangle", CANARY)


# -- in memory ------------------------------------------------------------------------
_BUILTIN = {"filter": ("INPUT", "FORWARD", "OUTPUT"),
            "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
            "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING")}
_TARGETS = {"ACCEPT", "DROP", "REJECT", "RETURN", "MARK", "DNAT", "SNAT", "MASQUERADE"}
_JUMP = re.compile(r"(?:^| )-j (\S+)")


@dataclass
class MemoryIptables:
    """An :class:`Iptables` in dictionaries (as kube-proxy's iptablestest.FakeIPTables): restore input is
    applied with ``--noflush`` semantics, one table at a time, and refused like iptables refuses it (a rule
    in or to a missing chain, ``-X`` of a chain still jumped to). ``restores`` keeps every input; ``fail``
    may be set to a callable ``(text)`` that raises, to play a node that refuses a restore."""

    opts: NodeOptions = NodeOptions()
    tables: dict = field(default_factory=lambda: {t: {c: [] for c in cs} for t, cs in _BUILTIN.items()})
    restores: list = field(default_factory=list)
    sysctls: dict = field(default_factory=dict)
    fail: object = None

    def save(self, table: str) -> str:
        chains = self.tables[table]
        user = sorted(c for c in chains if c not in _BUILTIN[table])
        lines = [f"*{table}"] + [f":{c} ACCEPT [0:0]" for c in _BUILTIN[table]] + [f":{c} - [0:0]" for c in user]
        lines += [f"-A {c} {r}" for c in list(_BUILTIN[table]) + user for r in chains[c]]
        return "\n".join(lines + ["COMMIT"]) + "\n"

    def restore_all(self, text: str) -> None:
        if self.fail is not None:
            self.fail(text)
        self.restores.append(text)
        table, work = None, None
        for n, line in enumerate(text.splitlines(), start=1):
            if line.startswith("*"):
                table, work = line[1:], {c: list(r) for c, r in self.tables[line[1:]].items()}
            elif line == "COMMIT":
                self.tables[table] = work
            elif line.startswith(":"):
                chain = line[1:].split()[0]
                if chain not in _BUILTIN[table]:
                    work[chain] = []
            else:
                self._apply(table, work, line, n)

    def _apply(self, table: str, work: dict, line: str, n: int) -> None:
        op, chain, rest = (line.split(" ", 2) + [""])[:3]
        if op == "-A":
            target = (_JUMP.findall(" " + rest) or [""])[-1]
            if chain not in work or (target and target not in _TARGETS and target not in work):
                raise DatapathError(f"iptables-restore: line {n} failed ({table}): {line}")
            work[chain].append(rest)
        elif op == "-X":
            used = any(_JUMP.findall(" " + r) == [chain] for rules in work.values() for r in rules)
            if chain not in work or chain in _BUILTIN[table] or used:
                raise DatapathError(f"iptables-restore: line {n} failed ({table}): {line}")
            del work[chain]
        else:
            raise DatapathError(f"iptables-restore: line {n}: unknown command {op!r}")

    def ensure_chain(self, table: str, chain: str) -> None:
        self.tables[table].setdefault(chain, [])

    def ensure_rule(self, table: str, chain: str, args: list[str]) -> None:
        rule = _args_text(args)
        if rule not in self.tables[table][chain]:
            self.tables[table][chain].insert(0, rule)

    def delete_rule(self, table: str, chain: str, args: list[str]) -> None:
        rules = self.tables[table].get(chain, [])
        if _args_text(args) in rules:
            rules.remove(_args_text(args))

    def delete_chain(self, table: str, chain: str) -> None:
        self.tables[table].pop(chain, None)

    def node_sysctls(self) -> None:
        self.sysctls.update(NODE_SYSCTLS)

    def options(self) -> NodeOptions:
        return self.opts


class MemoryTables:
    """Every node's :class:`MemoryIptables`, made on first use: ``tables("node-a")``."""

    def __init__(self, opts: NodeOptions = NodeOptions()):
        self.opts = opts
        self.nodes: dict[str, MemoryIptables] = {}

    def __call__(self, node: str) -> MemoryIptables:
        if node not in self.nodes:
            self.nodes[node] = MemoryIptables(self.opts)
        return self.nodes[node]


# -- in a node's namespace -------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _has_random_fully() -> bool:
    """HasRandomFully(): iptables is 1.6.2 or newer (kube-proxy reads ``iptables --version``)."""
    out = subprocess.run(["iptables", "--version"], capture_output=True, text=True).stdout
    found = re.search(r"v(\d+)\.(\d+)\.(\d+)", out)
    return bool(found) and tuple(int(x) for x in found.groups()) >= (1, 6, 2)


class NetnsIptables:
    """The iptables of namespace ``netns``, through the tools kube-proxy uses."""

    def __init__(self, netns: str):
        self.netns = netns

    def _run(self, argv: list[str], text: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(argv, input=text, text=True, capture_output=True,
                              preexec_fn=_netns.preexec(self.netns, None, new_session=False))
        if check and proc.returncode:
            raise DatapathError(f"{argv[0]} in {self.netns} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def save(self, table: str) -> str:
        return self._run(["iptables-save", "-t", table]).stdout

    def restore_all(self, text: str) -> None:
        self._run(["iptables-restore", "-w", "--noflush", "--counters"], text)

    def ensure_chain(self, table: str, chain: str) -> None:
        if self._run(["iptables", "-w", "-t", table, "-S", chain], check=False).returncode:
            self._run(["iptables", "-w", "-t", table, "-N", chain])

    def ensure_rule(self, table: str, chain: str, args: list[str]) -> None:
        if self._run(["iptables", "-w", "-t", table, "-C", chain, *args], check=False).returncode:
            self._run(["iptables", "-w", "-t", table, "-I", chain, *args])

    def delete_rule(self, table: str, chain: str, args: list[str]) -> None:
        self._run(["iptables", "-w", "-t", table, "-D", chain, *args], check=False)

    def delete_chain(self, table: str, chain: str) -> None:
        self._run(["iptables", "-w", "-t", table, "-X", chain], check=False)

    def node_sysctls(self) -> None:
        _netns.sysctl(self.netns, NODE_SYSCTLS)

    def options(self) -> NodeOptions:
        with _netns.entered(self.netns):
            with open("/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal") as f:
                liberal = f.read().strip() != "0"
            counters = _nfacct.ensure((NFACCT_INVALID, NFACCT_LOCALHOST))
        return replace(NodeOptions(), random_fully=_has_random_fully(), tcp_be_liberal=liberal, nfacct=counters)


def restore(netns: str, text: str) -> None:
    """A flushing ``iptables-restore`` of whole tables in namespace ``netns`` (what the bench times for
    :func:`labkit.agent.kubeproxy.nat_table`; the agent syncs with :func:`sync` instead)."""
    NetnsIptables(netns)._run(["iptables-restore", "-w"], text)


def restore_noflush(netns: str, text: str) -> None:
    """``iptables-restore -w --noflush --counters`` in namespace ``netns``, as kube-proxy loads every sync
    (utiliptables.RestoreAll with NoFlushTables and RestoreCounters): the chains ``text`` declares are
    flushed and refilled, every other chain keeps its rules (what the bench times for :func:`partial_table`)."""
    NetnsIptables(netns).restore_all(text)

def nat_table(services: Iterable, topology: Topology, node: str | None = None,
              options: NodeOptions = NodeOptions()) -> str:
    """The whole ``nat`` table of a kube-proxy node after a full sync, built-in chains and their jumps
    included: input for a flushing ``iptables-restore`` (what the bench times), not how kube-proxy syncs."""
    node = node or topology.nodes[0].name
    full = render(services, topology, node, options).text
    body = full[full.index("*nat\n") + 5:].splitlines()
    declared = [line for line in body if line.startswith(":")]
    head = ["*nat"] + [f":{c} ACCEPT [0:0]" for c in ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING")]
    jumps = [j.rule() for j in jumps_into("nat")]
    return "\n".join(head + [chain_line(CANARY)] + declared + jumps + body[len(declared):]) + "\n"


def partial_table(services: Iterable, topology: Topology, changed: Iterable[str], existing: Iterable[str] = (),
                  node: str | None = None, options: NodeOptions = NodeOptions()) -> str:
    """The input of one **partial** sync (kube-proxy >= 1.27, MinimizeIPTablesRestore) for an
    ``iptables-restore --noflush`` (:func:`restore_noflush`) onto a node whose tables hold the state before
    the change: the whole ``filter`` table (kube-proxy always writes it), in ``nat`` the declarations (which
    flush) and every rule of KUBE-SERVICES, KUBE-NODEPORTS, KUBE-POSTROUTING and KUBE-MARK-MASQ, and the
    KUBE-SVC/SVL/EXT/SEP chains only of the services named in ``changed`` (kube-proxy's
    serviceUpdateResult/endpointUpdateResult UpdatedServices). ``existing`` are the nat chains
    ``iptables-save`` shows before the change: service chains no longer used are declared (flushed) and
    ``-X``-deleted. Unchanged services' chains are not in the text; ``--noflush`` keeps them.

    Adding endpoint b2 to ``web`` writes ``web``'s chains and the new endpoint's KUBE-SEP, not ``db``'s:

    >>> from labkit.agent.services import Services
    >>> topo = Topology.default("demo")
    >>> svcs = Services.in_memory(topo)
    >>> web, db = svcs.add("web", 80, ["b1:8080"]), svcs.add("db", 5432, ["b1:5432"])
    >>> before = chains_in(nat_table(svcs.list(), topo))
    >>> text = partial_table([svcs.add_backend("web", "b2:8080"), db], topo, {"web"}, before)
    >>> [line.split()[0] for line in text[text.index("*nat"):].splitlines() if line.startswith(":")]
    [':KUBE-SERVICES', ':KUBE-NODEPORTS', ':KUBE-POSTROUTING', ':KUBE-MARK-MASQ', ':KUBE-SVC-LOLE4ISW44XBNF3G', \
':KUBE-SEP-AYUPPDUJE3VKXBT5', ':KUBE-SEP-POV4HANKZOY4OMY6']
    >>> sum(line.startswith("-A KUBE-SERVICES") for line in text.splitlines())  # web, db, the NodePorts jump (nat)
    3

    Taking it out again ``-X``-deletes the endpoint's chain (it was in ``existing``)::

    >>> after = chains_in(nat_table(svcs.list(), topo))
    >>> [l for l in partial_table([svcs.remove_backend("web", "b2:8080"), db], topo, {"web"}, after).splitlines()
    ...  if l.startswith("-X")]
    ['-X KUBE-SEP-POV4HANKZOY4OMY6']
    """
    node = node or topology.nodes[0].name
    return render(services, topology, node, options, set(changed), existing).text

