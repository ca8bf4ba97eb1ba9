"""A running lab on the datapath side: up, attach, down; its members as handles; its teardown.

- :mod:`labkit.lab.lab` — :class:`Lab` and the pod, node and external handles;
- :mod:`labkit.lab.traffic` — the steps' traffic, sent from the pods' client processes;
- :mod:`labkit.lab.teardown` — undo what the ledger recorded;
- :mod:`labkit.lab.inventory` — every lab from its state files (what ``labkit list`` reads);
- :mod:`labkit.lab.standby` — the loader and agent processes started ahead of a build.

``Lab`` is imported on first use: the clients that read only the inventory (``labkit list``) do not load
pyroute2.
"""
__all__ = ["Lab", "PodHandle", "NodeHandle", "BPFFS_ROOT"]


def __getattr__(name: str):
    if name in __all__:
        from labkit.lab import lab

        return getattr(lab, name)
    raise AttributeError(f"module 'labkit.lab' has no attribute {name!r}")
