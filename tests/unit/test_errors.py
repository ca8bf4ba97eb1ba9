"""One error family: every labkit error is a LabkitError and the builtin it resembles."""
from __future__ import annotations

import errno

import pytest

import labkit.errors as errors_mod
from labkit.errors import (
    AccessError,
    CleanupError,
    ConfigError,
    DatapathError,
    DoorDownError,
    LabBusyError,
    LabkitError,
    LabStateError,
    LabTimeoutError,
    LimitError,
    NetnsError,
    NotFoundError,
    PolicyError,
    PrivilegeError,
    RequestError,
    TopologyError,
)

BUILTIN = {
    TopologyError: ValueError,
    ConfigError: ValueError,
    NotFoundError: LookupError,
    LabBusyError: BlockingIOError,
    LabStateError: RuntimeError,
    NetnsError: OSError,
    DatapathError: RuntimeError,
    PrivilegeError: PermissionError,
    CleanupError: RuntimeError,
    LabTimeoutError: TimeoutError,
    PolicyError: ValueError,
    AccessError: PermissionError,
    RequestError: ValueError,
    LimitError: OSError,
    DoorDownError: ConnectionError,
}


def test_every_exported_error_is_covered():
    """The table below covers every error class labkit.errors exports."""
    exported = {getattr(errors_mod, n) for n in errors_mod.__all__} - {LabkitError}
    assert exported == set(BUILTIN)


@pytest.mark.parametrize("cls", list(BUILTIN), ids=lambda c: c.__name__)
def test_error_is_labkit_and_builtin(cls):
    """Each error can be caught as LabkitError and as its builtin."""
    assert issubclass(cls, LabkitError) and issubclass(cls, Exception)
    assert issubclass(cls, BUILTIN[cls])
    with pytest.raises(BUILTIN[cls]):
        raise cls("x")
    with pytest.raises(LabkitError):
        raise cls("x")


def test_netns_error_keeps_errno():
    """NetnsError(errno, msg) keeps errno and strerror like OSError."""
    err = NetnsError(errno.ENOENT, "interface 'lxc-a1' not found")
    assert err.errno == errno.ENOENT and err.strerror == "interface 'lxc-a1' not found"
    assert isinstance(err, OSError)


def test_busy_error_keeps_errno():
    """LabBusyError(errno, msg) keeps errno."""
    err = LabBusyError(errno.EAGAIN, "held")
    assert err.errno == errno.EAGAIN and "held" in str(err)


def test_message_is_kept():
    """The message is the str() of the error."""
    assert str(NotFoundError("pod 'a9' not found")) == "pod 'a9' not found"
