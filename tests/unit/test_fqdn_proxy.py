"""labkit.fqdn.proxy: the pieces of the DNS proxy that need no lab (the datapath tests run the rest)."""
from __future__ import annotations

import socket

from labkit.fqdn import proxy


def test_original_destination_from_ancillary_data():
    """IP_ORIGDSTADDR's cmsg (SOL_IP, 20) is a sockaddr_in: family, port, address — read as (address, port)."""
    sin = (2).to_bytes(2, "little") + (53).to_bytes(2, "big") + socket.inet_aton("198.51.100.100") + bytes(8)
    assert proxy._orig_dst([(socket.SOL_IP, 20, sin)]) == ("198.51.100.100", 53)
    assert proxy._orig_dst([(socket.SOL_IP, 8, sin)]) is None


def test_max_delay_default_is_ciliums():
    """--tofqdns-proxy-response-max-delay defaults to 100ms in v1.16's agent config."""
    assert proxy.MAX_DELAY == 0.1
