"""nfacct counters (``nfnetlink_acct``), as kube-proxy's pkg/proxy/util/nfacct creates them:
one NFNL_MSG_ACCT_NEW message per counter on a NETLINK_NETFILTER socket, in the
node's network namespace (counters are per namespace). A counter that exists
already answers EBUSY, which counts as there.

    >>> _message("ct_state_invalid_dropped_pkts", seq=1)[:8].hex()
    '3800000000070504'
"""
from __future__ import annotations

import errno
import socket
import struct

__all__ = ["ensure"]

_NETLINK_NETFILTER = 12
_NFNL_SUBSYS_ACCT = 7
_NFNL_MSG_ACCT_NEW = 0
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_CREATE = 0x1, 0x4, 0x400
_NLMSG_ERROR = 2
_NFACCT_NAME = 1


def _attr(kind: int, data: bytes) -> bytes:
    size = 4 + len(data)
    return struct.pack("=HH", size, kind) + data + b"\0" * (-size % 4)


def _message(name: str, seq: int) -> bytes:
    """NFNL_MSG_ACCT_NEW for counter ``name``: nlmsghdr, nfgenmsg (AF_UNSPEC, version 0), NFACCT_NAME."""
    payload = struct.pack("=BBH", socket.AF_UNSPEC, 0, 0) + _attr(_NFACCT_NAME, name.encode() + b"\0")
    kind = (_NFNL_SUBSYS_ACCT << 8) | _NFNL_MSG_ACCT_NEW
    return struct.pack("=IHHII", 16 + len(payload), kind, _NLM_F_REQUEST | _NLM_F_ACK | _NLM_F_CREATE, seq, 0) + payload


def ensure(names) -> frozenset:
    """Create the counters ``names`` in the calling thread's namespace; returns those that exist now."""
    ok = set()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER) as sock:
        for seq, name in enumerate(names, start=1):
            sock.send(_message(name, seq))
            reply = sock.recv(4096)
            kind = struct.unpack_from("=H", reply, 4)[0]
            code = -struct.unpack_from("=i", reply, 16)[0] if kind == _NLMSG_ERROR else 0
            if code in (0, errno.EBUSY, errno.EEXIST):
                ok.add(name)
    return frozenset(ok)
