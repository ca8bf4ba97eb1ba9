"""``labkit fqdn cache list``: what the agent's DNS proxy learnt, as ``cilium-dbg fqdn cache list``
prints it (one row per answer: endpoint, source, name, TTL, expiration, IPs), asked of the lab's agent
through labkitd."""
from __future__ import annotations

from labkit.cli import common
from labkit.cli.common import output_options, print_json

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
    lab = common.attach(args)
    if not (args.json or args.endpoint is not None or args.matchpattern):
        print(f"# {' '.join(CILIUM_COMMAND)}")
        for line in lab.fqdn.cache_list():
            print(line)
        return 0
    from labkit.agent.client import PREFIX
    from labkit.fqdn.cache import cache_list_lines
    from labkit.policy.matchpattern import matches

    answer = lab.policy.client.get(f"{PREFIX}/fqdn/cache")  # the entries themselves, to filter here
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
