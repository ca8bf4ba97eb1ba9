"""A running lab: up, attach, down; its members as handles; its teardown.

- :mod:`labkit.lab.lab` — :class:`Lab` and the pod, node and external handles;
- :mod:`labkit.lab.teardown` — undo what the ledger recorded.
"""
from labkit.lab.lab import BPFFS_ROOT, Lab, NodeHandle, PodHandle

__all__ = ["Lab", "PodHandle", "NodeHandle", "BPFFS_ROOT"]
