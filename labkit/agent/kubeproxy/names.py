"""kube-proxy's names and numbers: the service port name every chain is hashed from,
the chain prefixes, the masquerade mark, and the 1/n probabilities.

Every labkit Service is one Kubernetes service port in namespace ``default`` with no
port name, so its ``ServicePortName.String()`` is ``default/<name>``. kube-proxy hashes
that and the lower-case protocol (``portProtoHash``: sha256, base32, 16 characters);
an endpoint chain also hashes the endpoint ``ip:port``::

    >>> from labkit.agent.services import Service
    >>> web = Service("web", "198.19.0.10", 80)
    >>> port_name(web), svc_chain(web), sep_chain(web, "198.18.2.11:8080")
    ('default/web', 'KUBE-SVC-LOLE4ISW44XBNF3G', 'KUBE-SEP-AYUPPDUJE3VKXBT5')
    >>> svl_chain(web)[9:] == ext_chain(web)[9:] == svc_chain(web)[9:]
    True
    >>> probability(3), probability(2)
    ('0.3333333333', '0.5000000000')
"""
from __future__ import annotations

import base64
import hashlib

from labkit.config import SERVICE_MODES

__all__ = ["SERVICE_MODES", "NAMESPACE", "MASQ_MARK", "MASQ_VALUE", "SERVICE_CHAIN_PREFIXES", "port_name",
           "proto", "svc_chain", "svl_chain", "ext_chain", "sep_chain", "is_service_chain", "probability"]

NAMESPACE = "default"
#: --iptables-masquerade-bit 14 as NewProxier formats it: fmt.Sprintf("%#08x", 1<<14), eight digits after 0x
MASQ_VALUE = f"{1 << 14:#010x}"
#: the mark and mask as ``iptables-save`` prints them back
MASQ_MARK = "0x4000/0x4000"
#: KUBE-SVC (Cluster policy), KUBE-SVL (Local policy), KUBE-SEP (one endpoint), KUBE-FW, KUBE-EXT: what
#: kube-proxy's isServiceChainName recognises as its own when it deletes stale chains
SERVICE_CHAIN_PREFIXES = ("KUBE-SVC-", "KUBE-SVL-", "KUBE-SEP-", "KUBE-FW-", "KUBE-EXT-")


def _hash(text: str) -> str:
    """kube-proxy's portProtoHash: base32 of sha256, first 16 characters."""
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()[:16]


def port_name(svc) -> str:
    """``default/<name>``: ServicePortName.String() of the service's one unnamed port."""
    return f"{NAMESPACE}/{svc.name}"


def proto(svc) -> str:
    """The protocol as iptables spells it (``tcp``, ``udp``)."""
    return svc.protocol.lower()


def svc_chain(svc) -> str:
    """``KUBE-SVC-<hash>``: the endpoints for Cluster traffic policy."""
    return "KUBE-SVC-" + _hash(port_name(svc) + proto(svc))


def svl_chain(svc) -> str:
    """``KUBE-SVL-<hash>``: this node's endpoints, for externalTrafficPolicy Local."""
    return "KUBE-SVL-" + _hash(port_name(svc) + proto(svc))


def ext_chain(svc) -> str:
    """``KUBE-EXT-<hash>``: where NodePort and LoadBalancer traffic enters."""
    return "KUBE-EXT-" + _hash(port_name(svc) + proto(svc))


def sep_chain(svc, endpoint: str) -> str:
    """``KUBE-SEP-<hash of port name, protocol and endpoint ip:port>``."""
    return "KUBE-SEP-" + _hash(port_name(svc) + proto(svc) + endpoint)


def is_service_chain(chain: str) -> bool:
    """Whether kube-proxy owns ``chain`` as a per-service chain (it deletes such chains when stale)."""
    return chain.startswith(SERVICE_CHAIN_PREFIXES)


def probability(n: int) -> str:
    """``computeProbability(n)``: 1/n with ten decimals, as kube-proxy writes it into ``--probability``."""
    return f"{1.0 / n:0.10f}"
