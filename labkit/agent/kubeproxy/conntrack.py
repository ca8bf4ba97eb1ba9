"""Linux conntrack read back as rows: what kube-proxy's iptables mode relies on to
remember a connection's backend and its masquerade, beside the BPF CT rows.

    >>> row = parse_conntrack("udp 17 29 src=198.18.1.11 dst=198.19.0.10 sport=5000 dport=53 [UNREPLIED] "
    ...                       "src=198.18.2.11 dst=198.18.1.11 sport=8080 dport=5000 mark=0 use=1")[0]
    >>> row.line()
    'UDP - 198.18.1.11:5000 -> 198.19.0.10:53 | reply 198.18.2.11:8080 -> 198.18.1.11:5000 DNAT timeout=29s UNREPLIED'
"""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ConntrackRow", "parse_conntrack"]


@dataclass(frozen=True)
class ConntrackRow:
    """One Linux conntrack entry (``conntrack -L``): the original tuple, the reply tuple, state and mark.

    >>> r = parse_conntrack("tcp      6 431999 ESTABLISHED src=198.18.1.11 dst=198.19.0.10 sport=40000 dport=80 "
    ...                     "src=198.18.2.11 dst=198.18.1.11 sport=8080 dport=40000 [ASSURED] mark=0 use=1")[0]
    >>> r.flow(), r.reply(), r.dnat
    ('198.18.1.11:40000 -> 198.19.0.10:80', '198.18.2.11:8080 -> 198.18.1.11:40000', True)
    """

    proto: str
    timeout: int
    state: str
    src: str
    dst: str
    sport: int
    dport: int
    reply_src: str
    reply_dst: str
    reply_sport: int
    reply_dport: int
    flags: tuple[str, ...]
    mark: int

    def flow(self) -> str:
        return f"{self.src}:{self.sport} -> {self.dst}:{self.dport}"

    def reply(self) -> str:
        return f"{self.reply_src}:{self.reply_sport} -> {self.reply_dst}:{self.reply_dport}"

    @property
    def dnat(self) -> bool:
        """The reply comes from someone other than the original destination: DNAT happened."""
        return (self.reply_src, self.reply_sport) != (self.dst, self.dport)

    @property
    def snat(self) -> bool:
        """The reply goes to someone other than the original source: SNAT (masquerade) happened."""
        return (self.reply_dst, self.reply_dport) != (self.src, self.sport)

    def line(self) -> str:
        nat = "".join(x for x, on in ((" DNAT", self.dnat), (" SNAT", self.snat)) if on)
        return (f"{self.proto.upper()} {self.state or '-'} {self.flow()} | reply {self.reply()}"
                f"{nat} timeout={self.timeout}s {' '.join(self.flags)}").rstrip()

    def __str__(self) -> str:
        return self.line()


_FIELD = re.compile(r"(src|dst|sport|dport|mark)=(\S+)")


def parse_conntrack(text: str) -> list[ConntrackRow]:
    """Rows of ``conntrack -L`` output (TCP and UDP; other protocols are skipped)."""
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[0] not in ("tcp", "udp"):
            continue
        proto, timeout = parts[0], int(parts[2])
        state = parts[3] if proto == "tcp" else ""
        fields = _FIELD.findall(line)
        addrs = [v for k, v in fields if k in ("src", "dst", "sport", "dport")]
        if len(addrs) < 8:
            continue
        mark = next((int(v, 0) for k, v in fields if k == "mark"), 0)
        flags = tuple(w.strip("[]") for w in parts if w.startswith("["))
        rows.append(ConntrackRow(proto, timeout, state, addrs[0], addrs[1], int(addrs[2]), int(addrs[3]),
                                 addrs[4], addrs[5], int(addrs[6]), int(addrs[7]), flags, mark))
    return rows
