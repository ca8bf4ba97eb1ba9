"""labkit.door.api: framing, request decoding and errors crossing the door (no root, no labkitd)."""
from __future__ import annotations

import errno

import pytest

from labkit import errors
from labkit.door import api
from labkit.errors import RequestError


def test_frame_is_length_then_json():
    """A frame is a 4-byte big-endian length followed by that many bytes of compact UTF-8 JSON."""
    data = api.frame({"verb": "ct", "args": {"node": "node-ä"}})
    (length,) = api.HEADER.unpack(data[:4])
    assert length == len(data) - 4 and data[4:].decode() == '{"verb":"ct","args":{"node":"node-ä"}}'


@pytest.mark.parametrize("body, says", [
    (b"\xff\xfe", "undecodable bytes"),
    (b"{not json", "invalid JSON"),
    (b"[1, 2]", "got list"),
    (b'{"lab": "demo"}', "'verb' to be a non-empty string"),
    (b'{"verb": ""}', "'verb' to be a non-empty string"),
    (b'{"verb": 7}', "'verb' to be a non-empty string"),
    (b'{"verb": "ct", "lab": 3}', "'lab' to be a string or null"),
    (b'{"verb": "ct", "args": []}', "'args' to be an object"),
    (b'{"verb": "ct", "sudo": true}', "unknown fields"),
])
def test_malformed_requests_say_what_is_wrong(body, says):
    """Each malformed request body is refused with a RequestError naming the problem."""
    with pytest.raises(RequestError, match=says):
        api.decode_request(body)


def test_a_request_decodes_to_verb_lab_args():
    """A well-formed request gives its verb, lab (or None) and arguments (default empty)."""
    assert api.decode_request(b'{"verb": "hello"}') == ("hello", None, {})
    assert api.decode_request(b'{"verb": "ct", "lab": "demo", "args": {"node": "node-a"}}') == (
        "ct", "demo", {"node": "node-a"})


def test_errors_cross_with_their_class_message_and_errno():
    """A LabkitError answered by labkitd is raised in the client as the same class with the same message (and
    errno for the OSError family)."""
    for exc in (errors.NotFoundError("pod 'a9' not found"), errors.AccessError("`ct` on lab 'x_u1' refused"),
                errors.LimitError("too many"), errors.ConfigError("bad port")):
        back = api.error_of(api.failure(exc)["error"])
        assert type(back) is type(exc) and str(back) == str(exc)
    busy = errors.LabBusyError(errno.EAGAIN, "lab 'demo' is held")
    back = api.error_of(api.failure(busy)["error"])
    assert isinstance(back, errors.LabBusyError) and back.errno == errno.EAGAIN and back.strerror == "lab 'demo' is held"


def test_a_bug_in_labkitd_is_answered_without_its_insides():
    """An exception that is not a LabkitError comes back as a LabStateError saying labkitd failed."""
    err = api.failure(KeyError("x"))["error"]
    assert err["type"] == "LabStateError" and err["message"].startswith("labkitd failed: KeyError")


def test_an_unknown_error_type_becomes_a_lab_state_error():
    """An answer naming a class that is not labkit's (a forged or newer one) is raised as LabStateError."""
    assert isinstance(api.error_of({"type": "SystemExit", "message": "x"}), errors.LabStateError)


def test_socket_path_follows_the_environment(monkeypatch):
    """$LABKIT_DOOR names another socket; without it labkitd's default."""
    monkeypatch.delenv("LABKIT_DOOR", raising=False)
    assert api.socket_path() == api.SOCKET
    monkeypatch.setenv("LABKIT_DOOR", "/tmp/x/labkitd.sock")
    assert str(api.socket_path()) == "/tmp/x/labkitd.sock"
