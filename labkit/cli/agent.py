"""``labkit agent``: the lab's agent process — is it up, start it again, what it logged (each asked of labkitd,
which reaches the agent's root-only socket for you)."""
from __future__ import annotations

import time

from labkit.cli import common
from labkit.cli.common import output_options, print_json

__all__ = ["add_commands", "cmd_agent_status", "cmd_agent_restart", "cmd_agent_logs"]


def add_commands(add) -> None:
    """Add the agent commands to the parser (``add`` makes a subcommand)."""
    agent = add("agent", "the lab's agent: Services, trace monitor, GC timer and the API the CLI talks to"
                ).add_subparsers(dest="agent_command", metavar="COMMAND", required=True)
    p = agent.add_parser("status", help="is the agent answering: pid, uptime, services, what it restored",
                         description="Ask the agent's /v1/healthz on /run/labkit/<lab>/agent.sock through labkitd "
                                     "(like `cilium-dbg status`). Exit status 1 if it does not answer.")
    output_options(p, "the agent's answer as JSON")
    p.set_defaults(func=cmd_agent_status)
    p = agent.add_parser("restart", help="stop the agent (if it runs) and start a new one",
                         description="Stop the lab's agent (SIGTERM) and start a new one. It restores the Services "
                                     "and their ids from its journal and the pinned maps and rewrites only map "
                                     "entries that are wrong; the datapath keeps forwarding meanwhile.")
    output_options(p, "the new agent's status as JSON")
    p.set_defaults(func=cmd_agent_restart)
    p = agent.add_parser("logs", help="what the agent logged (start, restores, changes, errors)",
                         description="The agent's log, /run/labkit/<lab>/agent.log: one line per change it made, "
                                     "with the time it took, and every error.")
    p.add_argument("--tail", type=common.count, default=40, metavar="N", help="the last N lines (0: all)")
    p.set_defaults(func=cmd_agent_logs)


def _lines(st: dict) -> list[str]:
    if st.get("status") != "ok":
        return [f"agent: down ({st.get('error', 'no answer')})"]
    restored = st.get("restored", {})
    out = [f"agent: ok, pid {st['pid']}, up {st['uptime_s']:.1f} s, lab {st['lab']} "
           f"(Cilium {st.get('cilium')}, service mode {st.get('mode')})",
           f"services: {st['services']}",
           f"restored at start: {restored.get('services', 0)} services from {restored.get('source', '?')} "
           f"in {restored.get('seconds', 0)} s" + (" (journal damaged: rebuilt)" if restored.get("damaged") else "")]
    for problem in restored.get("problems", []):
        out.append(f"  {problem}")
    if restored.get("checked"):
        out.append(f"  {restored['checked']}")
    if restored.get("sync"):
        out.append(f"  maps synced: {restored['sync']}")
    if "policies" in st:
        pr = st.get("policy_restored") or {}
        line = f"policies: {st['policies']} (enforcement {st.get('policy_mode', 'default')}" + \
            (", audit)" if st.get("policy_audit") else ")")
        if pr.get("error"):
            line += f" (restore failed, maps left as they were: {pr['error']})"
        elif "endpoints" in pr:
            line += f", {pr['endpoints']} endpoint policy maps synced at start in {pr.get('seconds', 0)} s"
        out.append(line)
    mon, gc = st.get("monitor", {}), st.get("gc", {})
    out.append(f"monitor: {'running' if mon.get('running') else 'stopped'}, {mon.get('records', 0)} records written")
    out.append(f"gc timer: {'on' if gc.get('timer') else 'off'}" + (f" (last error: {gc['error']})" if gc.get("error") else ""))
    return out


def cmd_agent_status(args) -> int:
    lab = common.attach(args)
    st = lab.agent_status()
    if args.json:
        print_json(st)
    else:
        print("\n".join(_lines(st)))
        print(f"# the API (root's socket; labkitd asks it for you): "
              f"sudo curl --unix-socket /run/labkit/{lab.key}/agent.sock http://agent/v1/healthz")
    return 0 if st.get("status") == "ok" else 1


def cmd_agent_restart(args) -> int:
    lab = common.attach(args)
    t = time.monotonic()
    st = lab.restart_agent()
    if args.json:
        print_json(st)
        return 0
    print(f"agent restarted in {time.monotonic() - t:.2f} s")
    print("\n".join(_lines(st)))
    return 0


def cmd_agent_logs(args) -> int:
    lab = common.attach(args)
    got = lab.agent_logs(args.tail)
    for line in got["lines"]:
        print(line)
    print(f"# {got['path']}")
    return 0
