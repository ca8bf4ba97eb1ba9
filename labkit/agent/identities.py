"""Security identities of a lab, allocated by the agent from label sets, as cilium-agent does.

A pod's identity stands for its labels, not for the pod: the agent derives the pod's label
set (:func:`labkit.policy.identity.pod_labels`: its own labels under ``k8s:`` plus the
namespace, service-account and cluster labels) and asks the allocator
(:class:`~labkit.policy.identity.IdentityAllocator`) for that set's number, so two pods with
equal labels share one identity and a lab's pods are numbered from 256 in declaration order
(pkg/identity/numericidentity.go MinimalNumericIdentity). CIDR identities that policies need
(``toCIDR``) come from the same allocator, in the local scope.

The allocator lives in ``/run/labkit/<lab>/identities.json`` (``{identity: [labels…]}``, in
the lab's ledger): ``labkit up`` writes it, the agent reads it when it starts and writes it
after each policy change, so numbers never move while the lab is up.

    >>> from labkit.net.topology import Topology
    >>> topo = Topology.build("t", {"n1": ["p1", "p2", "p3"]}, labels={"p3": {"app": "p1"}})
    >>> topo, alloc = assign(topo)
    >>> [(p.name, p.identity) for p in topo.pods]
    [('p1', 256), ('p2', 257), ('p3', 256)]
"""
from __future__ import annotations

import json
import os

from labkit.errors import LabStateError
from labkit.net.ledger import Ledger, dir_lock, lab_dir
from labkit.net.topology import Pod, Topology
from labkit.policy.identity import IdentityAllocator, LabelSet, pod_labels

__all__ = ["IDENTITIES_FILE", "labels_of", "assign", "IdentityStore"]

IDENTITIES_FILE = "identities.json"


def labels_of(pod: Pod, namespace: str = "default") -> LabelSet:
    """The label set Cilium derives for ``pod`` (every lab pod lives in namespace ``default``).

    >>> from labkit.net.topology import Topology
    >>> labels_of(Topology.default().pod("a1")).get("k8s", "app")
    'a1'
    """
    return pod_labels(pod.labels, namespace)


def assign(topo: Topology, alloc: IdentityAllocator | None = None) -> tuple[Topology, IdentityAllocator]:
    """Every pod's identity from its labels, through ``alloc`` (a fresh allocator by default):
    the topology with those identities, and the allocator (to keep)."""
    alloc = alloc if alloc is not None else IdentityAllocator()
    ids = {p.name: alloc.allocate(labels_of(p)) for p in topo.pods}
    return topo.with_identities(ids), alloc


class IdentityStore:
    """``/run/labkit/<lab>/identities.json``: the allocator between processes."""

    def __init__(self, lab: str):
        self.lab = lab
        self.path = lab_dir(lab) / IDENTITIES_FILE

    def load(self) -> IdentityAllocator:
        """The allocator as last saved (an empty one when nothing was saved yet)."""
        try:
            with dir_lock(self.lab, shared=True):
                data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return IdentityAllocator()
        except ValueError as exc:
            raise LabStateError(f"lab '{self.lab}': identities file {self.path} is unreadable ({exc}); expected "
                                f"a JSON object {{identity: [labels]}}") from None
        return IdentityAllocator(previous=data)

    def save(self, alloc: IdentityAllocator) -> None:
        """Write the allocator (atomically; recorded in the ledger before the file first exists)."""
        with dir_lock(self.lab):
            if not self.path.exists():
                Ledger(self.lab).record("file", path=str(self.path))
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({str(k): v for k, v in alloc.snapshot().items()}, indent=1))
            os.replace(tmp, self.path)
