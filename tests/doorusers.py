"""Ordinary users for the tests of the privileged door: made for a test, removed after it, and a way to run
labkit's client as one of them.

    with learner("lkdoor-a") as alice:
        out = alice.python("from labkit.client import Lab; print(Lab.up('demo').key)")

A user's process imports labkit from a world-readable copy of this checkout's package (the checkout itself
may sit where only root can read, as CI's clone does), talks to the labkitd ``$LABKIT_DOOR`` names, and runs
with no capability, as a learner's notebook kernel does.
"""
from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

__all__ = ["Learner", "learner", "package_copy"]

REPO = Path(__file__).resolve().parents[1]
_COPY: dict[str, Path] = {}


def package_copy() -> Path:
    """A world-readable copy of this checkout's ``labkit`` package (made once per process): the directory to put
    on a user's PYTHONPATH."""
    if "dir" not in _COPY:
        root = Path(tempfile.mkdtemp(prefix="labkit-pkg-"))
        os.chmod(root, 0o755)
        shutil.copytree(REPO / "labkit", root / "labkit", ignore=shutil.ignore_patterns("__pycache__"))
        for dirpath, dirnames, filenames in os.walk(root):
            os.chmod(dirpath, 0o755)
            for f in filenames:
                os.chmod(os.path.join(dirpath, f), 0o644)
        _COPY["dir"] = root
    return _COPY["dir"]


@dataclass
class Learner:
    """A user made for a test."""

    name: str
    uid: int
    gid: int
    home: Path

    def env(self, **extra: str) -> dict[str, str]:
        """What a user's process gets: their home, the package copy, the test's labkitd."""
        env = {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name, "PATH": "/usr/local/bin:/usr/bin:/bin",
               "PYTHONPATH": str(package_copy()), "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1"}
        for key in ("LABKIT_DOOR", "CI"):
            if os.environ.get(key):
                env[key] = os.environ[key]
        env.update(extra)
        return env

    def argv(self, argv: list[str], **extra_env: str) -> list[str]:
        """The command line that runs ``argv`` as this user, in the environment :meth:`env` gives."""
        return ["runuser", "-u", self.name, "--", "env", "-i", *(f"{k}={v}" for k, v in self.env(**extra_env).items()),
                *argv]

    def run(self, argv: list[str], timeout: float = 600, input: str | None = None,
            **extra_env: str) -> subprocess.CompletedProcess:
        """``argv`` as this user (runuser), output captured as text."""
        return subprocess.run(self.argv(argv, **extra_env), capture_output=True, text=True, timeout=timeout,
                              cwd=str(self.home), input=input)

    def python(self, code: str, timeout: float = 600, **extra_env: str) -> subprocess.CompletedProcess:
        """Python ``code`` run as this user with the venv's interpreter (the code on its stdin)."""
        return self.run([sys.executable, "-"], timeout=timeout, input=code, **extra_env)

    def labkit(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """The ``labkit`` command as this user."""
        return self.run([sys.executable, "-m", "labkit", "cli", *args], timeout=timeout)


@contextlib.contextmanager
def learner(name: str) -> Iterator[Learner]:
    """User ``name`` (made fresh, with a home), removed with everything they left running afterwards."""
    _remove(name)
    subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True, capture_output=True)
    pw = pwd.getpwnam(name)
    try:
        yield Learner(name, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir))
    finally:
        _remove(name)


def _remove(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return
    subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
    subprocess.run(["userdel", "-r", "-f", name], capture_output=True)
