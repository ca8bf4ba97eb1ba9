"""labkit.client.procs: a process labkitd started, handled as subprocess.Popen — its stdio the caller's own pipes,
its exit status on a fourth (no labkitd: a stand-in lab starts the command here, as labkitd's sandbox would)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from labkit.client.procs import RemoteProcess, _environment, run

PY = sys.executable


def _shell_status(rc: int) -> int:
    """What the sandbox's wrapper shell writes: the exit code, or 128 + N for a command killed by signal N."""
    return rc if rc >= 0 else 128 - rc


class FakeLab:
    """The ``exec`` and ``signal`` verbs as labkitd answers them, run in this process: the command gets the
    request's three descriptors, and a thread writes its status to (a copy of) the fourth when it ends."""

    def __init__(self, status=_shell_status, write_status=True):
        self.calls: list[tuple[str, dict]] = []
        self.procs: dict[int, subprocess.Popen] = {}
        self.threads: list[threading.Thread] = []
        self.status, self.write_status = status, write_status

    def _call(self, verb, *, fds=None, **args):
        self.calls.append((verb, args))
        if verb == "exec":
            proc = subprocess.Popen(args["argv"], stdin=fds[0], stdout=fds[1], stderr=fds[2], env=args["env"],
                                    cwd=args["cwd"])
            status = os.dup(fds[3])

            def reap():
                rc = proc.wait()
                try:
                    if self.write_status:
                        os.write(status, f"{self.status(rc)}\n".encode())
                finally:
                    os.close(status)

            t = threading.Thread(target=reap, daemon=True)
            t.start()
            self.threads.append(t)
            pid = len(self.procs) + 1
            self.procs[pid] = proc
            return {"id": pid, "pid": proc.pid}
        if verb == "signal":
            self.procs[args["id"]].send_signal(getattr(signal, args["signal"]))
            return None
        raise AssertionError(f"unexpected verb {verb}")

    def join(self):
        for t in self.threads:
            t.join(10)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def lab():
    lab = FakeLab()
    yield lab
    for p in lab.procs.values():
        if p.poll() is None:
            p.kill()
    lab.join()


def test_communicate_sends_text_input_and_reads_stdout_and_stderr_apart(lab):
    """With text=True, input goes to the command's stdin; stdout and stderr come back apart, as str."""
    code = "import sys; d = sys.stdin.read(); print(d.upper()); print('err:' + d, file=sys.stderr); sys.exit(3)"
    p = RemoteProcess(lab, "a1", [PY, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)
    out, err = p.communicate("hello")
    assert (out, err, p.returncode) == ("HELLO\n", "err:hello\n", 3)


def test_communicate_with_bytes(lab):
    """Without text, input and output are bytes, passed through unchanged."""
    code = "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read()[::-1])"
    p = RemoteProcess(lab, "a1", [PY, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out, err = p.communicate(b"\x00\x01\xffabc")
    assert (out, err, p.returncode) == (b"cba\xff\x01\x00", None, 0)
    assert p.stderr is None


def test_stderr_to_stdout_merges_them(lab):
    """stderr=STDOUT gives the command one descriptor for both: the caller reads them as one stream."""
    code = "import sys; print('out', flush=True); print('err', file=sys.stderr, flush=True); print('out2')"
    p = RemoteProcess(lab, "a1", [PY, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, err = p.communicate()
    assert (out, err) == ("out\nerr\nout2\n", None)
    [(verb, args)] = lab.calls
    assert verb == "exec" and args["name"] == "a1" and args["argv"] == [PY, "-c", code]


def test_wait_with_a_timeout_raises_timeout_expired(lab):
    """wait(timeout) on a command still running raises TimeoutExpired naming the command; poll() says None until
    it ends, then its status."""
    p = RemoteProcess(lab, "a1", [PY, "-c", "import time; time.sleep(30)"])
    assert p.poll() is None
    with pytest.raises(subprocess.TimeoutExpired) as exc:
        p.wait(timeout=0.2)
    assert exc.value.cmd == p.args and p.returncode is None
    p.kill()
    assert p.wait(10) == 128 + signal.SIGKILL
    assert p.poll() == 128 + signal.SIGKILL


def test_communicate_after_a_timeout_gives_what_was_read(lab):
    """As with Popen, communicate(timeout) raising TimeoutExpired, then kill() and communicate() again, gives the
    whole output, and no reader thread fails on the way."""
    code = "import time; print('partial', flush=True); time.sleep(30)"
    p = RemoteProcess(lab, "a1", [PY, "-c", code], stdout=subprocess.PIPE, text=True)
    with pytest.raises(subprocess.TimeoutExpired):
        p.communicate(timeout=0.5)
    p.kill()
    assert p.communicate() == ("partial\n", None)
    assert p.returncode == 128 + signal.SIGKILL


def test_terminate_and_kill_go_to_labkitd_and_the_status_is_what_it_wrote(lab):
    """terminate() and kill() are `signal` requests with the process's id; the exit status is the one the status
    pipe carried (the wrapper shell's 128 + N)."""
    p = RemoteProcess(lab, "a1", [PY, "-c", "import time; time.sleep(30)"])
    q = RemoteProcess(lab, "a2", [PY, "-c", "import time; time.sleep(30)"])
    p.terminate()
    q.kill()
    assert (p.wait(10), q.wait(10)) == (143, 137)
    assert [c for c in lab.calls if c[0] == "signal"] == [("signal", {"id": p.id, "signal": "SIGTERM"}),
                                                          ("signal", {"id": q.id, "signal": "SIGKILL"})]
    p.terminate()  # ended: no request
    assert len([c for c in lab.calls if c[0] == "signal"]) == 2


def test_a_status_pipe_closed_without_a_status_reads_as_sigkill(lab):
    """When the status pipe closes with nothing written (the sandbox killed), the status is -SIGKILL."""
    lab.write_status = False
    p = RemoteProcess(lab, "a1", [PY, "-c", "pass"])
    assert p.wait(10) == -signal.SIGKILL


def test_the_last_line_of_the_status_pipe_is_the_status(lab):
    """The status is the pipe's last line, whatever the wrapper wrote before it."""
    lab.status = lambda rc: f"starting\n{rc + 40}"
    assert RemoteProcess(lab, "a1", [PY, "-c", "raise SystemExit(2)"]).wait(10) == 42


def test_run_captures_text_and_check_raises(lab):
    """run() captures stdout and stderr as text; check=True raises CalledProcessError with them."""
    done = run(lab, "a1", [PY, "-c", "print('hi')"])
    assert (done.args, done.returncode, done.stdout, done.stderr) == ([PY, "-c", "print('hi')"], 0, "hi\n", "")
    with pytest.raises(subprocess.CalledProcessError) as exc:
        run(lab, "a1", [PY, "-c", "import sys; print('no', file=sys.stderr); sys.exit(4)"], check=True)
    assert (exc.value.returncode, exc.value.stderr) == (4, "no\n")


def test_run_gives_the_command_input_or_nothing(lab):
    """run(input=...) feeds stdin; without input the command's stdin is /dev/null (it reads EOF at once)."""
    code = "import sys; print(repr(sys.stdin.read()))"
    assert run(lab, "a1", [PY, "-c", code], input="abc").stdout == "'abc'\n"
    assert run(lab, "a1", [PY, "-c", code]).stdout == "''\n"


def test_run_past_its_timeout_kills_the_command(lab):
    """run(timeout=...) raises TimeoutExpired and kills the command through labkitd."""
    with pytest.raises(subprocess.TimeoutExpired):
        run(lab, "a1", [PY, "-c", "import time; time.sleep(30)"], timeout=0.3)
    assert ("signal", {"id": 1, "signal": "SIGKILL"}) in lab.calls
    lab.join()
    assert lab.procs[1].returncode == -signal.SIGKILL


def test_no_descriptor_the_client_opened_stays_open(lab):
    """After communicate() (and after a failed start), every pipe the client opened is closed."""
    lab.join()
    before = _open_fds()
    p = RemoteProcess(lab, "a1", [PY, "-c", "import sys; print(sys.stdin.read())"], stdin=subprocess.PIPE,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.communicate(b"x")
    done = run(lab, "a1", [PY, "-c", "print(1)"], stdout=subprocess.DEVNULL)
    assert done.stdout is None
    lab.join()
    assert _open_fds() == before

    class Refusing:
        def _call(self, verb, **kw):
            raise PermissionError("refused")

    with pytest.raises(PermissionError):
        RemoteProcess(Refusing(), "a1", ["true"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE)
    assert _open_fds() == before


def test_the_command_inherits_only_the_allowed_environment(lab, monkeypatch):
    """Without env, the command gets PATH, LANG, LC_*, LABKIT_* ... of this process and nothing else; with env,
    exactly that."""
    monkeypatch.setenv("LC_TIME", "C")
    monkeypatch.setenv("LABKIT_DOOR", "/tmp/x.sock")
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    monkeypatch.setenv("HOME", "/root")
    env = _environment()
    assert env["LC_TIME"] == "C" and env["LABKIT_DOOR"] == "/tmp/x.sock" and env["PATH"] == os.environ["PATH"]
    assert "SECRET_TOKEN" not in env and "HOME" not in env
    assert all(k in ("PATH", "LANG", "LANGUAGE", "TERM", "TZ", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHASHSEED")
               or k.startswith(("LC_", "LABKIT_")) for k in env)
    code = "import os; print(os.environ.get('SECRET_TOKEN'), os.environ.get('LC_TIME'))"
    assert run(lab, "a1", [PY, "-c", code]).stdout == "None C\n"
    assert lab.calls[0][1]["env"] == env and lab.calls[0][1]["cwd"] == os.getcwd()
    run(lab, "a1", [PY, "-c", "pass"], env={"ONLY": "1"}, cwd="/")
    assert lab.calls[-1][1]["env"] == {"ONLY": "1"} and lab.calls[-1][1]["cwd"] == "/"


def test_the_context_manager_closes_the_pipes_and_waits(lab):
    """Leaving `with RemoteProcess(...)` closes its pipes and waits for its status."""
    with RemoteProcess(lab, "a1", [PY, "-c", "print('x')"], stdout=subprocess.PIPE) as p:
        assert p.stdout.readline() == b"x\n"
    assert p.stdout.closed and p.returncode == 0
