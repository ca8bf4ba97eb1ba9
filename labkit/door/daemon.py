"""labkitd itself: ``labkit daemon run`` serves the door until it is told to stop.

How it starts: a systemd unit in the VM (``vagrant/labkitd.service``: ``labkit daemon run``); on a host without
systemd ``sudo labkit daemon start`` runs it in the background (pid in ``/run/labkitd/labkitd.pid``, log in
``/run/labkitd/labkitd.log``) and ``sudo labkit daemon stop`` stops that one; ``make test``, ``make lab`` and
``.ci/run`` start it when it is not running and stop what they started.

Stopping labkitd (SIGTERM, or ``kill -9``) leaves every lab running: the datapath forwards, established
connections stay open, each lab's agent goes on. A new labkitd adopts every lab from its state files the first
time a request names it (:class:`labkit.door.labs.Labs`), with its evidence (:mod:`labkit.door.evidence`).

    $ sudo labkit daemon run
    labkitd ready on /run/labkitd/labkitd.sock (pid 4242)
"""
from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from labkit.door import api
from labkit.door.evidence import EvidenceFiles, read_checks
from labkit.door.labs import Labs, Limits
from labkit.door.server import Door
from labkit.errors import LabStateError, PrivilegeError

__all__ = ["run", "start", "stop", "status", "pid_path", "log_file", "main"]


def pid_path(sock: Path | None = None) -> Path:
    """The pid file ``labkit daemon start`` writes, beside the socket."""
    return (sock or api.socket_path()).parent / "labkitd.pid"


def log_file(sock: Path | None = None) -> Path:
    """Where a backgrounded labkitd writes its log."""
    return (sock or api.socket_path()).parent / "labkitd.log"


def _open_lab(files: EvidenceFiles):
    """What labkitd does when it opens a lab: its evidence read back belongs to it, and its checks' tries count."""
    from labkit.grading import checks

    def opened(held) -> None:
        files.opened(held.key, held.lab)
        tries: dict[str, int] = {}
        wrong: list[tuple[str, str, int]] = []  # wrong answers that counted: giving one again stays free
        for result in read_checks(held.key):
            if result.get("tries_restart"):  # the lab was taken down: its tries started again
                tries.clear()
                wrong.clear()
            elif result.get("attempt"):
                tries[result["exercise"]] = max(tries.get(result["exercise"], 0), int(result["attempt"]))
                if result.get("charged") and result.get("key") and not result.get("passed"):
                    wrong.append((result["exercise"], str(result["key"]), int(result["attempt"])))
        for exercise, n in tries.items():
            checks.set_attempts(exercise, n, lab=held.key)
        for exercise, key, n in wrong:
            checks.remember_wrong(exercise, key, n, lab=held.key)

    return opened


def build(path: Path, limits: Limits | None = None, log=None) -> Door:
    """The door, ready to serve (not serving yet): labs, the evidence read back, the socket."""
    from labkit.door import verbs
    from labkit.observe.evidence import JOURNAL

    os.environ["LABKIT_DOOR"] = str(path)  # where the evidence lives: beside this socket
    labs = Labs(limits or Limits.from_env())

    def lab_of(key: str):
        held = labs.held(key)
        return held.lab if held is not None else None

    from labkit.lab.standby import STANDBY

    STANDBY.keep = True  # a loader and an agent kept ready: the next `up` finds their imports done
    threading.Thread(target=STANDBY.fill, name="standby", daemon=True).start()
    files = EvidenceFiles(JOURNAL, lab_of)
    files.load_all()
    JOURNAL.sinks.append(files)
    labs.on_open = _open_lab(files)
    door: Door | None = None

    def handle(caller, body, fds):
        return verbs.handle(labs, caller, body, fds, door)

    door = Door(path, handle, labs.limits, log)
    door.labs = labs
    from labkit.door.supervise import Supervisor

    door.supervisor = Supervisor(labs, log=door.log)
    return door


def run(path: Path | None = None, quiet: bool = False) -> int:
    """Serve in the foreground until SIGTERM or SIGINT; labs keep running after it."""
    if os.geteuid() != 0:
        raise PrivilegeError("labkitd runs as root (it builds namespaces and loads BPF); "
                             "run `sudo labkit daemon run`")
    path = Path(path or api.socket_path())
    log = (lambda line: None) if quiet else None
    door = build(path, log=log)
    stopping = threading.Event()

    def stop(signum, frame) -> None:
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=door.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    door.supervisor.start()
    print(f"labkitd ready on {path} (pid {os.getpid()})", flush=True)
    try:
        door.serve_forever(poll_interval=0.5)
    finally:
        door.server_close()
    return 0


def status(path: Path | None = None, timeout: float = 5.0) -> dict | None:
    """labkitd's ``hello`` answer, or None when no labkitd answers on ``path``."""
    path = Path(path or api.socket_path())
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        sock.sendall(api.frame({"verb": "hello"}))
        head = _recv(sock, api.HEADER.size)
        (length,) = api.HEADER.unpack(head)
        import json

        reply = json.loads(_recv(sock, length))
        return reply.get("value") if reply.get("ok") else None
    except (OSError, ValueError):
        return None
    finally:
        sock.close()


def _recv(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def start(path: Path | None = None, timeout: float = 30.0) -> tuple[bool, int | None]:
    """Start labkitd in the background unless one answers already: (started now, its pid). Two starts at once
    take turns (a lock file beside the socket): the second finds the first's labkitd answering."""
    path = Path(path or api.socket_path())
    if status(path) is not None:
        return False, _read_pid(path)
    if os.geteuid() != 0:
        raise PrivilegeError("`labkit daemon start` needs root: run `sudo labkit daemon start`")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / "labkitd.start.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if status(path) is not None:  # another start got here first
            return False, _read_pid(path)
        return True, _spawn(path, timeout)


def _spawn(path: Path, timeout: float) -> int:
    """Start ``labkitd run`` on ``path`` in its own session, write its pid file, wait until it answers."""
    env = {**os.environ, "LABKIT_DOOR": str(path)}
    with open(log_file(path), "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "labkit", "labkitd", "run"], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True, env=env, close_fds=True)
    pid_path(path).write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout
    while status(path, timeout=1.0) is None:
        if proc.poll() is not None:
            tail = log_file(path).read_text(errors="replace")[-2000:]
            raise LabStateError(f"labkitd exited at start ({proc.returncode}); its log {log_file(path)}:\n{tail}")
        if time.monotonic() > deadline:
            proc.kill()
            raise LabStateError(f"labkitd did not answer on {path} within {timeout} s; see {log_file(path)}")
        time.sleep(0.05)
    return proc.pid


def _read_pid(path: Path) -> int | None:
    try:
        return int(pid_path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def stop(path: Path | None = None, timeout: float = 10.0) -> bool:
    """Stop the labkitd ``start`` started (its pid file); False when there was none to stop."""
    path = Path(path or api.socket_path())
    pid = _read_pid(path)
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pid_path(path).unlink(missing_ok=True)
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
    pid_path(path).unlink(missing_ok=True)
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m labkit labkitd run|start|stop|status`` (what ``labkit daemon`` runs)."""
    import argparse

    parser = argparse.ArgumentParser(prog="labkitd", description="labkit's privileged door")
    parser.add_argument("action", choices=("run", "start", "stop", "status"))
    parser.add_argument("--socket", default=None, help=f"where to listen (default $LABKIT_DOOR or {api.SOCKET})")
    parser.add_argument("--quiet", action="store_true", help="run: no line per request on stderr")
    args = parser.parse_args(argv)
    path = Path(args.socket) if args.socket else None
    if args.action == "run":
        return run(path, args.quiet)
    if args.action == "start":
        started, pid = start(path)
        print(f"labkitd {'started' if started else 'already running'} (pid {pid or '?'}) on {path or api.socket_path()}")
        return 0
    if args.action == "stop":
        print("labkitd stopped" if stop(path) else "no labkitd started by `labkit daemon start` to stop")
        return 0
    st = status(path)
    print(f"labkitd answers on {path or api.socket_path()}: {st}" if st else
          f"no labkitd answers on {path or api.socket_path()}; {api.START_HINT}")
    return 0 if st else 1
