"""``labkit daemon``: labkitd itself — run it, start it in the background, stop it, ask whether it answers.

labkitd (:mod:`labkit.door`) is the one root service of the machine that every other lab command talks to;
in the VM systemd runs it (``vagrant/labkitd.service``). Running and stopping it are root's, so those commands
want sudo; ``status`` is anyone's::

    sudo labkit daemon start          # in the background: pid and log beside the socket
    labkit daemon status              # does it answer, and who it thinks you are
    sudo labkit daemon stop           # stops the one `start` started
    sudo labkit daemon run            # in the foreground, one log line per request

``--socket PATH`` (default ``$LABKIT_DOOR``, else ``/run/labkitd/labkitd.sock``) serves or asks another one.
"""
from __future__ import annotations

import os
from pathlib import Path

from labkit.cli.common import CliError, output_options, print_json

__all__ = ["add_commands", "cmd_daemon_run", "cmd_daemon_start", "cmd_daemon_stop", "cmd_daemon_status"]


def add_commands(add) -> None:
    """Add the daemon commands to the parser (``add`` makes a subcommand)."""
    daemon = add("daemon", "labkitd, the root service every lab command talks to: run, start, stop, status"
                 ).add_subparsers(dest="daemon_command", metavar="COMMAND", required=True)
    p = daemon.add_parser("run", help="serve labkitd in the foreground until Ctrl-C or SIGTERM (root)",
                          description="Serve labkitd on its socket in the foreground, one log line per request on "
                                      "stderr, until Ctrl-C or SIGTERM. Labs keep running after it stops. Needs root.")
    _socket_option(p)
    p.add_argument("--quiet", action="store_true", help="no line per request")
    p.set_defaults(func=cmd_daemon_run)
    p = daemon.add_parser("start", help="start labkitd in the background unless one answers already (root)",
                          description="Start labkitd in the background (its pid and log beside the socket) unless "
                                      "one answers already. Needs root.")
    _socket_option(p)
    p.set_defaults(func=cmd_daemon_start)
    p = daemon.add_parser("stop", help="stop the labkitd `labkit daemon start` started (root)",
                          description="Stop the labkitd `labkit daemon start` started (its pid file); labs keep "
                                      "running. A labkitd systemd runs is stopped with `sudo systemctl stop labkitd`.")
    _socket_option(p)
    p.set_defaults(func=cmd_daemon_stop)
    p = daemon.add_parser("status", help="does labkitd answer: its version, who it thinks you are, its limits",
                          description="Ask labkitd `hello`: its protocol version, your user as labkitd sees it "
                                      "(and whether you are an instructor), the limits it keeps. Exit 1 when none "
                                      "answers.")
    _socket_option(p)
    output_options(p, "labkitd's answer as JSON (null when none answers)")
    p.set_defaults(func=cmd_daemon_status)


def _socket_option(p) -> None:
    p.add_argument("--socket", metavar="PATH", default=None,
                   help="labkitd's socket (default: $LABKIT_DOOR, else /run/labkitd/labkitd.sock)")


def _path(args) -> Path:
    from labkit.door import api

    return Path(args.socket) if args.socket else api.socket_path()


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise CliError(f"`labkit daemon {what}` needs root (labkitd builds namespaces and loads BPF): "
                       f"run `sudo labkit daemon {what}`")


def cmd_daemon_run(args) -> int:
    from labkit.door import daemon

    _need_root("run")
    return daemon.run(_path(args), args.quiet)


def cmd_daemon_start(args) -> int:
    from labkit.door import daemon

    _need_root("start")
    path = _path(args)
    started, pid = daemon.start(path)
    print(f"labkitd {'started' if started else 'already running'} (pid {pid or '?'}) on {path}")
    if started:
        print(f"its log: {daemon.log_file(path)}; `sudo labkit daemon stop` stops it")
    return 0


def cmd_daemon_stop(args) -> int:
    from labkit.door import daemon

    path = _path(args)
    try:
        stopped = daemon.stop(path)
    except PermissionError:
        raise CliError("`labkit daemon stop` needs root (labkitd runs as root): run `sudo labkit daemon stop`") from None
    print("labkitd stopped; the labs keep running" if stopped else
          f"no labkitd started by `labkit daemon start` to stop (no pid in {daemon.pid_path(path)}); "
          f"one systemd runs stops with `sudo systemctl stop labkitd`")
    return 0


def cmd_daemon_status(args) -> int:
    from labkit.door import api, daemon

    path = _path(args)
    st = daemon.status(path)
    if args.json:
        print_json(st)
        return 0 if st else 1
    if st is None:
        print(f"no labkitd answers on {path}; {api.START_HINT}")
        return 1
    who = f"{st.get('user')} (uid {st.get('uid')}{', instructor' if st.get('instructor') else ''})"
    print(f"labkitd answers on {path}: protocol version {st.get('version')}, you are {who}")
    limits = st.get("limits") or {}
    if limits:
        print("limits: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in limits.items()))
    return 0
