"""``labkit fqdn cache list``: what the agent's DNS proxy learnt, as ``cilium-dbg fqdn cache list``
prints it (one row per answer: endpoint, source, name, TTL, expiration, IPs)."""
from __future__ import annotations

from labkit.cli.common import output_options, print_json
from labkit.cli.policy import agent_policies

__all__ = ["add_commands", "cmd_fqdn_cache_list", "CILIUM_COMMAND"]

#: What a learner would type on a Cilium node for the same table.
CILIUM_COMMAND = ["cilium-dbg", "fqdn", "cache", "list"]


def add_commands(add) -> None:
    """Add ``fqdn cache list`` to the parser (``add`` makes a subcommand)."""
    fq = add("fqdn", "toFQDNs: the DNS proxy's cache").add_subparsers(dest="fqdn_command", metavar="COMMAND",
                                                                      required=True)
    cache = fq.add_parser("cache", help="the DNS cache").add_subparsers(dest="cache_command", metavar="COMMAND",
                                                                       required=True)
    p = cache.add_parser("list", help="the names the DNS proxy learnt, as `cilium-dbg fqdn cache list`",
                         description="Every answer the DNS proxy let through for a name a DNS rule allows: the "
                                     "endpoint that asked, the name, its TTL, when it expires (lab clock, shown as "
                                     "wall-clock time) and its IPs. Expired answers are not listed.")
    p.add_argument("-p", "--matchpattern", default="", help="only names matching this pattern")
    p.add_argument("-e", "--endpoint", type=int, default=None, help="only this endpoint id")
    output_options(p, "the cache entries as JSON (lab-clock times)")
    p.set_defaults(func=cmd_fqdn_cache_list)


def cmd_fqdn_cache_list(args) -> int:
    from labkit.agent.client import PREFIX
    from labkit.fqdn.cache import cache_list_lines
    from labkit.policy.matchpattern import matches

    answer = agent_policies(args).client.get(f"{PREFIX}/fqdn/cache")
    entries = [e for e in answer["entries"] if e["expires"] > answer["now"]
               and (args.endpoint is None or e["endpoint"] == args.endpoint)
               and (not args.matchpattern or matches(args.matchpattern, e["name"]))]
    if args.json:
        print_json(entries)
        return 0
    print(f"# {' '.join(CILIUM_COMMAND)}")
    for line in cache_list_lines(entries, answer["now"], answer["wall"]):
        print(line)
    return 0
