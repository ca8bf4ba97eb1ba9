"""Who is asking, and which labs are theirs.

labkitd asks the kernel who is on the other end of a connection (``SO_PEERCRED`` for the uid, gid
and pid, ``SO_PEERGROUPS`` for the supplementary groups, both fixed when the client connected):
a :class:`Caller`. A lab belongs to the uid that brought it up. A user sees and touches only their
own labs; root and the members of the group ``labkit-instructors`` see and touch every lab.

Two users may each have a lab called ``demo``: what the kernel sees (namespaces, pins, cgroups,
the run directory) is named by the lab's *key*, the name with an owner part — ``demo_u1000`` for
uid 1000, plain ``demo`` for root's labs. (An underscore, which a lab's name never has: bpffs refuses names
with a dot.) A user names their labs by name; an instructor may also
name anyone's lab by its key. Naming someone else's lab is refused whether or not it exists, so a
refusal says nothing of other users' labs.

    >>> lab_key(1000, "demo"), lab_key(0, "demo"), owner_of("demo_u1000"), owner_of("demo")
    ('demo_u1000', 'demo', 1000, 0)
    >>> alice = Caller(uid=1000, gid=1000, pid=1, name="alice", groups=frozenset())
    >>> resolve(alice, "demo", "ct")
    'demo_u1000'
    >>> resolve(alice, "demo_u1001", "ct")
    Traceback (most recent call last):
    labkit.errors.AccessError: `ct` on lab 'demo_u1001' refused: you may use only your own labs
"""
from __future__ import annotations

import grp
import os
import pwd
import re
import socket
import struct
from dataclasses import dataclass

from labkit.errors import AccessError, RequestError
from labkit.net.topology import LAB_KEY, LAB_NAME

__all__ = ["INSTRUCTORS", "Caller", "lab_key", "owner_of", "name_of", "variant_key", "resolve", "may", "refuse",
           "LAB_KEY"]

#: The group whose members (and root) see and touch every lab, read answer keys and grade.
INSTRUCTORS = "labkit-instructors"
_KEY = re.compile(r"^(?P<name>[a-z0-9][a-z0-9-]{0,23})(?:_u(?P<uid>[1-9][0-9]{0,9}))?$")  # LAB_KEY with its parts
_SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)
_UCRED = struct.Struct("3i")


@dataclass(frozen=True)
class Caller:
    """The process at the other end of a connection, as the kernel vouches for it."""

    uid: int
    gid: int
    pid: int
    name: str  #: the user's login name (or ``uid<N>`` when it has no passwd entry)
    groups: frozenset[int]

    @property
    def instructor(self) -> bool:
        """Root, or a member of :data:`INSTRUCTORS`."""
        if self.uid == 0:
            return True
        try:
            gid = grp.getgrnam(INSTRUCTORS).gr_gid
        except KeyError:
            return False
        return gid in self.groups or gid == self.gid

    @classmethod
    def of_socket(cls, sock: socket.socket) -> "Caller":
        """The peer of a connected unix socket."""
        pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, 4 * 1024)
            groups = frozenset(struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4]))
        except OSError:
            groups = frozenset()
        return cls(uid, gid, pid, _login(uid), groups)

    @classmethod
    def me(cls) -> "Caller":
        """This process as a caller (labkitd's own requests, tests)."""
        return cls(os.getuid(), os.getgid(), os.getpid(), _login(os.getuid()), frozenset(os.getgroups()))

    def __str__(self) -> str:
        return f"{self.name} (uid {self.uid})"


def _login(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


def lab_key(owner: int, name: str) -> str:
    """The key of ``owner``'s lab ``name``."""
    return name if owner == 0 else f"{name}_u{owner}"


def owner_of(key: str) -> int:
    """The uid that owns the lab with this key."""
    m = _KEY.fullmatch(key)
    if not m:
        raise RequestError(f"lab {key[:60]!r}: expected a lab name (1-24 of a-z, 0-9, '-') or a lab key (name_u<uid>)")
    return int(m["uid"] or 0)


def name_of(key: str) -> str:
    """The name part of a key (``demo_u1000`` → ``demo``)."""
    m = _KEY.fullmatch(key)
    return m["name"] if m else key


def variant_key(key: str, variant: str) -> str:
    """The key of lab ``key``'s second lab ``variant`` (``demo_u1000`` → ``demo-ipt_u1000``).

    >>> variant_key("demo_u1000", "ipt"), variant_key("demo", "ipt")
    ('demo-ipt_u1000', 'demo-ipt')
    """
    return lab_key(owner_of(key), f"{name_of(key)}-{variant}")


def resolve(caller: Caller, lab: str, verb: str) -> str:
    """The key of the lab ``caller`` means by ``lab``: their own lab of that name, or (an instructor, or the
    owner) a key naming it. Another user's key is refused (:func:`refuse`), whether or not that lab exists."""
    if not isinstance(lab, str) or not LAB_KEY.fullmatch(lab):
        raise RequestError(f"`{verb}`: lab {str(lab)[:60]!r} is not a lab name; expected 1-24 characters of a-z, "
                           f"0-9 and '-' starting with a letter or digit")
    if LAB_NAME.fullmatch(lab):
        return lab_key(caller.uid, lab)
    if owner_of(lab) == caller.uid or caller.instructor:
        return lab
    raise refuse(verb, lab)


def may(caller: Caller, key: str) -> bool:
    """Whether ``caller`` may see and touch the lab with key ``key``."""
    return caller.instructor or owner_of(key) == caller.uid


def refuse(verb: str, lab: str) -> AccessError:
    """The refusal of ``verb`` on ``lab``: names both, says nothing else."""
    return AccessError(f"`{verb}` on lab '{lab}' refused: you may use only your own labs")
