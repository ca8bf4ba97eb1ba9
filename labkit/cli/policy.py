"""``labkit policy``: apply, delete, list CiliumNetworkPolicies and show a pod's policy map (the agent
writes the maps); ``labkit identity list``: the identities, as ``cilium-dbg identity list``.

Every request goes through labkitd: to the lab's agent (``lab.policy``), and for a pod's map to labkitd, which
reads it (and, for ``-n`` and ``--json``, dumps it with its read-only bpftool)."""
from __future__ import annotations

import json
import os
import sys

from labkit.cli import common
from labkit.cli.common import output_options, print_json, table

__all__ = ["add_commands", "cmd_policy_apply", "cmd_policy_delete", "cmd_policy_list", "cmd_policy_get",
           "cmd_identity_list", "agent_policies", "map_rows"]


def add_commands(add) -> None:
    """Add the policy and identity commands to the parser (``add`` makes a subcommand)."""
    pol = add("policy", "network policies (CiliumNetworkPolicy): what the agent writes into every endpoint's "
                        "policy map").add_subparsers(dest="policy_command", metavar="COMMAND", required=True)
    p = pol.add_parser("apply", help="add or replace the policies of a YAML/JSON file",
                       description="Apply FILE ('-': standard input), one or more CiliumNetworkPolicies "
                                   "(cilium.io/v2) as `kubectl apply -f` would: a policy of the same namespace and "
                                   "name is replaced. The agent checks them whole (fields, selectors that select "
                                   "nothing) before it writes anything, then writes only what changed in each "
                                   "endpoint's cilium_policy_<id> map.")
    p.add_argument("file", metavar="FILE", help="a YAML (several documents allowed) or JSON file")
    output_options(p, "what the agent wrote, as JSON")
    p.set_defaults(func=cmd_policy_apply)
    p = pol.add_parser("delete", help="remove policies by file or by name",
                       description="Remove the policies FILE holds, or the policy NAME ([NAMESPACE/]NAME), and "
                                   "write each endpoint's difference (an endpoint no policy selects loses its map: "
                                   "allow-all).")
    p.add_argument("target", metavar="FILE|NAME", help="a policy file, or a policy name (namespace/name)")
    output_options(p, "what the agent wrote, as JSON")
    p.set_defaults(func=cmd_policy_delete)
    p = pol.add_parser("list", help="the policies the agent holds and the pods each selects",
                       description="Every policy: namespace, name, number of rules and the pods it selects.")
    output_options(p, "the policies as a JSON list (with the objects as applied)")
    p.set_defaults(func=cmd_policy_list)
    p = pol.add_parser("get", help="a pod's policy map, as `cilium-dbg bpf policy get`",
                       description="The pinned policy map of POD's endpoint, read from bpffs and printed as "
                                   "`cilium-dbg bpf policy get <endpoint id>` prints it, after the bpftool command "
                                   "that dumps the same map.")
    p.add_argument("pod", metavar="POD", help="a pod (a1)")
    p.add_argument("-n", "--numeric", action="store_true", help="identities as numbers, not labels")
    output_options(p, "the rows and the path as JSON")
    p.set_defaults(func=cmd_policy_get)

    ident = add("identity", "security identities: the reserved ones and those the agent allocated").add_subparsers(
        dest="identity_command", metavar="COMMAND", required=True)
    p = ident.add_parser("list", help="every identity and its labels, as `cilium-dbg identity list`",
                         description="Reserved identities (1-10), the pods' (from 256) and CIDR identities "
                                     "(local scope, from 16777217), each with its labels.")
    output_options(p, "{identity: [labels]} as JSON (allocated identities only)")
    p.set_defaults(func=cmd_identity_list)


def agent_policies(args):
    """``lab.policy`` of lab ``args.lab``: the agent's client, its requests carried by labkitd."""
    return common.attach(args).policy


def map_rows(lab, path: str) -> list:
    """The rows of the pinned policy map ``path`` as typed :class:`~labkit.maps.policy.PolicyRow` (labkitd's
    read-only ``bpftool -j map dump pinned PATH``, decoded here: the raw key and value bytes it always prints)."""
    from labkit.maps.policy import PolicyEntry, PolicyKey, PolicyRow

    done = lab.bpftool("-j", "map", "dump", "pinned", path)
    if done.returncode != 0:
        last = ((done.stderr or "").strip().splitlines() or ["no output"])[-1]
        raise common.CliError(f"bpftool could not dump {path} ({last})")

    def raw(hexes) -> bytes:
        return bytes(int(b, 16) for b in hexes)

    return [PolicyRow(PolicyKey.from_bytes(raw(item["key"])), PolicyEntry.from_bytes(raw(item["value"])))
            for item in json.loads(done.stdout or "[]")]


def _read(path: str, what: str) -> tuple[str, str]:
    if path == "-":
        return sys.stdin.read(), "standard input"
    try:
        with open(path) as f:
            return f.read(), path
    except OSError as exc:
        raise common.CliError(f"policy {what}: cannot read {path} ({exc.strerror})") from None


def _print_report(report: dict, verb: str, names: list[str]) -> None:
    eps = report.get("endpoints", {})
    print(f"{verb} {', '.join(names)} ({report.get('agent_seconds')} s in the agent)")
    for pod, c in sorted(eps.items()):
        made = "created, " if c.get("created") else ""
        print(f"  {pod}: {made}{c['added']} added, {c['changed']} changed, {c['deleted']} deleted")
    for path in report.get("removed", []):
        print(f"  {path}: removed (no policy selects the endpoint any more: allow-all)")
    for kind in ("added", "deleted"):
        if report.get("ipcache", {}).get(kind):
            print(f"  ipcache {kind}: {', '.join(report['ipcache'][kind])}")
    for w in report.get("warnings", []):
        print(f"  warning: {w}")


def cmd_policy_apply(args) -> int:
    text, source = _read(args.file, "apply")
    report = agent_policies(args).apply(text, source)
    if args.json:
        print_json(report)
        return 0
    _print_report(report, "applied", report["applied"])
    if report.get("replaced"):
        print(f"  replaced: {', '.join(report['replaced'])}")
    print("try next:")
    for pod in sorted(report.get("endpoints", {}))[:1]:
        print(f"  labkit --lab {args.lab} policy get {pod}")
    print(f"  labkit --lab {args.lab} policy list")
    return 0


def cmd_policy_delete(args) -> int:
    pols = agent_policies(args)
    if os.path.isfile(args.target) or args.target == "-":
        from labkit.policy.rules import parse_policies

        text, source = _read(args.target, "delete")
        targets = [(p.namespace, p.name) for p in parse_policies(text, source)]
    else:
        ns, _, name = args.target.rpartition("/")
        targets = [(ns or "default", name)]
    reports = [pols.delete(name, ns) for ns, name in targets]
    if args.json:
        print_json(reports)
        return 0
    for (ns, name), report in zip(targets, reports):
        _print_report(report, "deleted", [f"{ns}/{name}"])
    return 0


def cmd_policy_list(args) -> int:
    policies = agent_policies(args).list()
    if args.json:
        print_json(policies)
        return 0
    if not policies:
        print(f"no policies in lab {args.lab}; apply one with `labkit --lab {args.lab} policy apply FILE`")
        return 0
    rows = [["NAMESPACE", "NAME", "RULES", "SELECTS"]]
    rows += [[p["namespace"], p["name"], str(p["rules"]), ", ".join(p["selects"]) or "-"] for p in policies]
    for row in table(rows):
        print(row)
    return 0


def cmd_policy_get(args) -> int:
    lab = common.attach(args)
    view = lab.policy.get(args.pod)
    info = view.info
    if args.json:
        rows = map_rows(lab, view.path) if view.pinned else []
        print_json({"pod": view.pod, "path": view.path, "endpoint_id": info["endpoint_id"],
                    "command": view.command, "lines": view.lines,
                    "rows": [{"key": str(r.key), "entry": str(r.entry.flags), "packets": r.entry.packets,
                              "bytes": r.entry.bytes, "prefix": r.key.l4_prefix} for r in rows]})
        return 0
    if not view.pinned:
        print(f"pod {view.pod} (endpoint {info['endpoint_id']} on {info['node']}): no policy map at {view.path}: "
              f"no policy enforces on it, so the datapath allows every packet")
        return 0
    print(f"# {' '.join(view.command)}")
    if args.numeric:
        from labkit.maps.policy import policy_get_lines

        lines = policy_get_lines(map_rows(lab, view.path), numeric=True)
    else:
        lines = view.lines
    for line in lines:
        print(line)
    return 0


def cmd_identity_list(args) -> int:
    from labkit.agent.client import PREFIX

    answer = agent_policies(args).client.get(f"{PREFIX}/identity")
    if args.json:
        print_json(answer["identities"])
        return 0
    for line in answer["lines"]:
        print(line)
    return 0
