"""labkit.door.owners: lab keys, who may use which lab, refusals that say nothing of others' labs (no root)."""
from __future__ import annotations

import socket

import pytest

from labkit.door import owners
from labkit.door.owners import Caller, lab_key, name_of, owner_of, resolve, variant_key
from labkit.errors import AccessError, RequestError
from labkit.net.topology import Topology

ALICE = Caller(uid=1000, gid=1000, pid=1, name="alice", groups=frozenset())
BOB = Caller(uid=1001, gid=1001, pid=2, name="bob", groups=frozenset())
ROOT = Caller(uid=0, gid=0, pid=3, name="root", groups=frozenset())


def test_keys_carry_the_owner_except_for_root():
    """A user's lab is keyed name_u<uid>; root's keeps its name; both read back to owner and name."""
    assert lab_key(1000, "demo") == "demo_u1000" and lab_key(0, "demo") == "demo"
    assert (owner_of("demo_u1000"), name_of("demo_u1000")) == (1000, "demo")
    assert (owner_of("demo"), name_of("demo")) == (0, "demo")


def test_two_users_get_two_labs_called_demo():
    """alice's and bob's 'demo' are different keys, hence different namespaces, pins and cgroups."""
    a, b = resolve(ALICE, "demo", "up"), resolve(BOB, "demo", "up")
    assert a != b
    ta, tb = Topology.default(a), Topology.default(b)
    assert not set(ta.all_netns()) & set(tb.all_netns())


def test_naming_another_users_key_is_refused_whether_or_not_it_exists():
    """bob naming alice's key is refused with one line naming the verb and the lab, nothing else."""
    with pytest.raises(AccessError) as err:
        resolve(BOB, "demo_u1000", "ct")
    assert str(err.value) == "`ct` on lab 'demo_u1000' refused: you may use only your own labs"
    with pytest.raises(AccessError):
        resolve(BOB, "never-existed_u1000", "ct")


def test_a_user_may_name_their_own_key_and_root_anyones():
    """The owner may use their key; root may use any key; a user never reaches root's labs by name."""
    assert resolve(ALICE, "demo_u1000", "ct") == "demo_u1000"
    assert resolve(ROOT, "demo_u1000", "ct") == "demo_u1000"
    assert resolve(ALICE, "dptest", "ct") == "dptest_u1000"


def test_instructors_group_sees_every_lab(monkeypatch):
    """A member of labkit-instructors may name any user's key."""
    import grp

    monkeypatch.setattr(grp, "getgrnam", lambda name: type("G", (), {"gr_gid": 4242})())
    teacher = Caller(uid=1500, gid=1500, pid=4, name="teacher", groups=frozenset({4242}))
    assert teacher.instructor and resolve(teacher, "demo_u1000", "ct") == "demo_u1000"
    assert not ALICE.instructor


@pytest.mark.parametrize("bad", ["", "Demo", "a/b", "../x", "x\x00y", "a" * 200, "demo_u0", "demo.uabc",
                                 "demo_u1000_u1001", "demo.u1000", "-x", "demo\n", 7, None])
def test_lab_names_that_are_not_names_are_refused(bad):
    """Slashes, dots outside the owner part, NUL, newlines, 200 characters, non-strings: a RequestError."""
    with pytest.raises(RequestError):
        resolve(ALICE, bad, "ct")


def test_variant_keys_keep_the_owner_part():
    """A user's second lab 'ipt' of 'demo' is demo-ipt_u<uid>; root's is demo-ipt."""
    assert variant_key("demo_u1000", "ipt") == "demo-ipt_u1000" and variant_key("demo", "ipt") == "demo-ipt"


def test_the_kernel_says_who_is_on_the_other_end():
    """Caller.of_socket reads SO_PEERCRED and SO_PEERGROUPS: on a socketpair it is this very process."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        me = Caller.of_socket(a)
    finally:
        a.close()
        b.close()
    import os

    assert (me.uid, me.gid, me.pid) == (os.getuid(), os.getgid(), os.getpid())
    assert set(os.getgroups()) <= set(me.groups) | {me.gid}


def test_refusal_text_is_the_one_refuse_makes():
    """owners.refuse is the only wording of a refusal."""
    assert str(owners.refuse("down", "x_u9")) == "`down` on lab 'x_u9' refused: you may use only your own labs"
