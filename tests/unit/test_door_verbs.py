"""labkit.door.verbs: every argument typed and bounded, and handle() refusing a request in one answer before any verb
runs (no root, no lab: a stand-in Labs and verbs of the test's own)."""
from __future__ import annotations

import json
import os
import threading

import pytest

from labkit.door import api, verbs
from labkit.door.labs import Limits
from labkit.door.owners import Caller
from labkit.door.verbs import VERBS, Args, handle, verb
from labkit.errors import NotFoundError, RequestError

ALICE = Caller(uid=1000, gid=1000, pid=4242, name="alice", groups=frozenset())
ROOT = Caller(uid=0, gid=0, pid=1, name="root", groups=frozenset())


# -- Args --------------------------------------------------------------------------------------
def _refused(call) -> str:
    with pytest.raises(RequestError) as exc:
        call()
    return str(exc.value)


def test_str_is_bounded_and_has_no_nul():
    """str(): a string within max_len; longer, with a NUL, or not a string is refused naming the argument."""
    a = Args("v", {"s": "node-a", "long": "x" * 11, "nul": "a\x00b", "num": 5})
    assert a.str("s", max_len=6) == "node-a"
    assert _refused(lambda: a.str("long", max_len=10)) == \
        "`v`: argument 'long' must be at most 10 characters, got '11 characters'"
    assert _refused(lambda: a.str("nul")) == "`v`: argument 'nul' must be a string without NUL, got 'a\\x00b'"
    assert _refused(lambda: a.str("num")) == "`v`: argument 'num' must be a string, got 5"


def test_a_missing_argument_is_refused_unless_it_has_a_default():
    """Without a default an absent (or null) argument is refused; with one, the default comes back as given."""
    a = Args("v", {"n": None})
    assert _refused(lambda: a.str("s")) == "`v`: argument 's' is missing"
    assert _refused(lambda: a.int("n", 0, 9)) == "`v`: argument 'n' is missing"
    assert a.str("s", None) is None and a.str("s", "dflt") == "dflt" and a.int("n", 0, 9, 7) == 7


def test_int_is_bounded_and_a_bool_is_not_an_int():
    """int(): whole numbers within [lo, hi]; out of range, a float, a string or a bool (true is 1 in Python) refused."""
    a = Args("clock", {"lo": 0, "hi": 10, "over": 11, "t": True, "f": 1.0, "s": "3"})
    assert (a.int("lo", 0, 10), a.int("hi", 0, 10)) == (0, 10)
    assert _refused(lambda: a.int("over", 0, 10)) == "`clock`: argument 'over' must be from 0 to 10, got 11"
    for key, shown in (("t", "True"), ("f", "1.0"), ("s", "'3'")):
        assert _refused(lambda key=key: a.int(key, 0, 10)) == \
            f"`clock`: argument '{key}' must be a whole number, got {shown}"


def test_bool_takes_only_true_or_false():
    """bool(): true and false pass; 1 or "yes" are refused."""
    a = Args("v", {"y": True, "n": False, "one": 1, "word": "yes"})
    assert a.bool("y") is True and a.bool("n") is False and a.bool("absent", False) is False
    assert "must be true or false, got 1" in _refused(lambda: a.bool("one"))
    assert "must be true or false, got 'yes'" in _refused(lambda: a.bool("word"))


def test_strs_is_a_bounded_list_of_strings():
    """strs(): a list of strings, at most max_items of at most max_len each, none with a NUL."""
    a = Args("exec", {"argv": ["ip", "route"], "many": ["x"] * 4, "long": ["xyz"], "nul": ["a\x00"],
                      "mixed": ["a", 1], "str": "ip route"})
    assert a.strs("argv") == ["ip", "route"]
    assert "must be at most 3 items, got '4 items'" in _refused(lambda: a.strs("many", max_items=3))
    assert "strings of at most 2 characters without NUL" in _refused(lambda: a.strs("long", max_len=2))
    assert "without NUL" in _refused(lambda: a.strs("nul"))
    assert "must be a list of strings" in _refused(lambda: a.strs("mixed"))
    assert "must be a list of strings" in _refused(lambda: a.strs("str"))


def test_mapping_is_an_object_of_bounded_size():
    """mapping(): an object of at most max_items entries; larger, or a list, refused."""
    a = Args("exec", {"env": {"A": "1", "B": "2"}, "list": [["A", "1"]]})
    assert a.mapping("env", max_items=2) == {"A": "1", "B": "2"}
    assert "must be an object of at most 1 entries" in _refused(lambda: a.mapping("env", max_items=1))
    assert "must be an object of at most 256 entries" in _refused(lambda: a.mapping("list"))


def test_hex_is_bytes_within_a_size():
    """hex(): hex text becomes bytes; text that is not hex, or longer than 2*max_bytes, is refused."""
    a = Args("step.udp", {"data": "68656c6c6f", "odd": "abc", "word": "zz", "big": "00" * 5})
    assert a.hex("data", 5) == b"hello"
    assert "must be hex bytes, got 'abc'" in _refused(lambda: a.hex("odd", 5))
    assert "must be hex bytes, got 'zz'" in _refused(lambda: a.hex("word", 5))
    assert "must be at most 8 characters" in _refused(lambda: a.hex("big", 4))
    assert a.hex("absent", 4, None) is None


def test_plain_takes_plain_data_and_refuses_objects():
    """plain(): tagged tuples come back as tuples; a `$c` object (a class the client names) is refused."""
    a = Args("check", {"answer": {"$t": [60, 8000]}, "obj": {"$c": "CtRow", "f": {}}})
    assert a.plain("answer") == (60, 8000)
    assert _refused(lambda: a.plain("obj")) == ("`check` argument 'obj': expected plain data (strings, numbers, "
                                                "lists, tuples, mappings), got an object of class 'CtRow'")


def test_done_refuses_arguments_no_getter_read():
    """done() passes once every argument was read, and refuses those never asked for, by name."""
    a = Args("ct", {"node": "node-a", "nodee": 1, "extra": 2})
    a.str("node")
    assert _refused(a.done) == "`ct`: unknown arguments 'extra', 'nodee'"
    b = Args("ct", {"node": "node-a"})
    b.str("node")
    b.done()


# -- handle() ----------------------------------------------------------------------------------
class _Lock:
    """A lab lock that says whether it is held."""

    def __init__(self):
        self.held = 0

    def __enter__(self):
        self.held += 1

    def __exit__(self, *exc):
        self.held -= 1


class _Labs:
    """What handle() and the verbs of these tests need of Labs."""

    def __init__(self):
        self.limits = Limits()
        self.locks: dict[str, _Lock] = {}

    def lock(self, key):
        return self.locks.setdefault(key, _Lock())

    def get(self, key):
        raise NotFoundError(f"lab '{key}' not found")


class _Door:
    def __init__(self):
        self.lines: list[str] = []

    def log(self, line):
        self.lines.append(line)


@pytest.fixture
def test_verbs():
    """Verbs registered for one test, removed after it; ``calls`` holds each Ctx they ran with."""
    names: list[str] = []
    calls: list = []

    def register(name, fn=None, **kw):
        def body(ctx):
            calls.append(ctx)
            return fn(ctx) if fn else {"key": ctx.key}

        verb(name, **kw)(body)
        names.append(name)

    register.calls = calls
    yield register
    for name in names:
        VERBS.pop(name, None)


def _body(verb_name, lab=None, **args) -> bytes:
    req = {"verb": verb_name, "args": args}
    if lab is not None:
        req["lab"] = lab
    return json.dumps(req).encode()


def _error(reply) -> tuple[str, str]:
    assert reply["ok"] is False
    return reply["error"]["type"], reply["error"]["message"]


def test_a_verb_is_registered_once():
    """verb() refuses a name already registered."""
    with pytest.raises(ValueError, match="registered twice"):
        verb("hello")(lambda ctx: None)


def test_a_verb_gets_the_callers_own_lab_and_its_answer_is_wire_json(test_verbs):
    """A verb on lab 'demo' runs with alice's key demo_u1000 and its arguments; its value is answered as wire JSON."""
    test_verbs("test.echo", lambda ctx: (ctx.name, ctx.key, ctx.args.int("n", 0, 9)))
    reply = handle(_Labs(), ALICE, _body("test.echo", "demo", n=3), [])
    assert reply == {"ok": True, "value": {"$t": ["demo", "demo_u1000", 3]}}
    [ctx] = test_verbs.calls
    assert ctx.caller is ALICE and ctx.verb == "test.echo" and ctx.fds == []


@pytest.mark.parametrize("body, says", [
    (b"not json", "request: expected a JSON object, got invalid JSON"),
    (b"\xff\xfe", "request: expected UTF-8 JSON"),
    (b"[1, 2]", "request: expected a JSON object, got list"),
    (b'{"verb": ""}', "request: expected 'verb' to be a non-empty string"),
    (b'{"verb": "hello", "args": []}', "request 'hello': expected 'args' to be an object, got list"),
    (b'{"verb": "hello", "extra": 1}', "request 'hello': unknown fields ['extra']"),
])
def test_a_malformed_body_is_a_request_error(body, says):
    """A body that is not a request object is answered with RequestError saying what is wrong with it."""
    kind, message = _error(handle(_Labs(), ALICE, body, []))
    assert kind == "RequestError" and message.startswith(says)


def test_an_unknown_verb_is_answered_with_the_known_verbs():
    """An unknown verb is a RequestError listing every verb labkitd knows, sorted."""
    kind, message = _error(handle(_Labs(), ALICE, _body("cct", "demo"), []))
    assert kind == "RequestError"
    assert message == f"request: unknown verb 'cct'; labkitd knows {', '.join(sorted(VERBS))}"
    assert "ct" in VERBS and "hello" in VERBS and "exec" in VERBS  # the verb modules registered theirs


def test_an_instructor_verb_is_refused_to_a_user(test_verbs):
    """An instructor-only verb is an AccessError for a user, and is not run; root runs it."""
    test_verbs("test.grade", lab=False, instructor=True)
    kind, message = _error(handle(_Labs(), ALICE, _body("test.grade"), []))
    assert (kind, message) == ("AccessError",
                               "`test.grade` refused: it is for instructors (root or the group labkit-instructors)")
    assert test_verbs.calls == []
    assert handle(_Labs(), ROOT, _body("test.grade"), []) == {"ok": True, "value": {"key": None}}


def test_more_descriptors_than_a_verb_takes_are_refused(test_verbs):
    """A request carrying more descriptors than its verb takes is refused before the verb runs."""
    test_verbs("test.none")
    test_verbs("test.two", fds=2)
    r, w = os.pipe()
    try:
        assert _error(handle(_Labs(), ALICE, _body("test.none", "demo"), [r])) == (
            "RequestError", "`test.none`: carried 1 file descriptors, expected none")
        assert _error(handle(_Labs(), ALICE, _body("test.two", "demo"), [r, w, r])) == (
            "RequestError", "`test.two`: carried 3 file descriptors, expected 2")
        assert test_verbs.calls == []
        assert handle(_Labs(), ALICE, _body("test.two", "demo"), [r, w])["ok"]
        assert test_verbs.calls[0].fds == [r, w]
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("lab, kind, says", [
    ("demo_u1001", "AccessError", "`test.lab` on lab 'demo_u1001' refused: you may use only your own labs"),
    ("Demo Lab", "RequestError", "`test.lab`: lab 'Demo Lab' is not a lab name"),
    (None, "RequestError", "`test.lab`: the request names no lab"),
])
def test_a_lab_the_caller_may_not_use_is_refused_before_the_verb(test_verbs, lab, kind, says):
    """Another user's key, a bad name or no lab at all is refused and the verb never runs."""
    test_verbs("test.lab")
    got = _error(handle(_Labs(), ALICE, _body("test.lab", lab), []))
    assert got[0] == kind and got[1].startswith(says)
    assert test_verbs.calls == []


def test_the_owner_may_name_their_lab_by_its_key(test_verbs):
    """alice naming her own key demo_u1000 is her lab demo_u1000."""
    test_verbs("test.lab")
    assert handle(_Labs(), ALICE, _body("test.lab", "demo_u1000"), [])["value"] == {"key": "demo_u1000"}


def test_a_changing_verb_runs_under_its_labs_lock(test_verbs):
    """A verb registered with change=True runs holding its lab's lock; one without does not take it."""
    labs = _Labs()
    seen = {}
    test_verbs("test.change", lambda ctx: seen.setdefault("change", labs.lock(ctx.key).held), change=True)
    test_verbs("test.read", lambda ctx: seen.setdefault("read", labs.lock(ctx.key).held))
    assert handle(labs, ALICE, _body("test.change", "demo"), [])["ok"]
    assert handle(labs, ALICE, _body("test.read", "demo"), [])["ok"]
    assert seen == {"change": 1, "read": 0} and labs.lock("demo_u1000").held == 0


def test_a_labkit_error_from_a_verb_is_answered_with_its_class(test_verbs):
    """A LabkitError the verb raises crosses back as its class and message (and errno for an OSError kind)."""
    test_verbs("test.held", lambda ctx: ctx.held)
    test_verbs("test.args", lambda ctx: ctx.args.done())
    assert _error(handle(_Labs(), ALICE, _body("test.held", "demo"), [])) == (
        "NotFoundError", "lab 'demo' is not up; start it with `labkit --lab demo up`")
    assert _error(handle(_Labs(), ALICE, _body("test.args", "demo", bogus=1), [])) == (
        "RequestError", "`test.args`: unknown arguments 'bogus'")


def test_a_bug_in_a_verb_is_a_lab_state_error_without_a_traceback(test_verbs, capsys):
    """A non-labkit exception is answered as LabStateError 'labkitd failed: ...'; the traceback goes to labkitd's
    log (stderr), never into the answer."""
    test_verbs("test.bug", lambda ctx: 1 / 0)
    reply = handle(_Labs(), ALICE, _body("test.bug", "demo"), [])
    assert reply == {"ok": False, "error": {"type": "LabStateError", "errno": None,
                                            "message": "labkitd failed: ZeroDivisionError: division by zero"}}
    assert "Traceback" not in json.dumps(reply)
    assert "Traceback" in capsys.readouterr().err


def test_a_value_that_cannot_cross_is_labkitds_bug(test_verbs, capsys):
    """A verb returning an object wire cannot send is answered as labkitd's failure, not a half answer."""
    test_verbs("test.obj", lambda ctx: threading.Lock())
    kind, message = _error(handle(_Labs(), ALICE, _body("test.obj", "demo"), []))
    assert kind == "LabStateError" and message.startswith("labkitd failed: TypeError: wire: cannot send")


def test_each_request_is_logged_in_one_line(test_verbs):
    """With a door, handle() logs who, which verb, which lab and the outcome of each request."""
    test_verbs("test.log")
    door = _Door()
    handle(_Labs(), ALICE, _body("test.log", "demo"), [], door)
    handle(_Labs(), ALICE, _body("test.log", "demo_u1001"), [], door)
    handle(_Labs(), ALICE, b"{", [], door)
    assert [line.rsplit(" ", 2)[0] for line in door.lines] == [
        "alice(1000) test.log demo ok", "alice(1000) test.log demo_u1001 AccessError", "alice(1000) ? - RequestError"]
    assert all(line.endswith(" ms") for line in door.lines)


def test_hello_says_who_labkitd_thinks_you_are():
    """The hello verb (no lab) answers the caller's uid and name, the protocol version and the limits."""
    reply = handle(_Labs(), ALICE, _body("hello"), [])
    assert reply["ok"] and reply["value"] == {"version": api.VERSION, "uid": 1000, "user": "alice",
                                              "instructor": False, "limits": Limits().to_dict()}
    assert verbs.VERBS["hello"].lab is False
