"""labkit: a Jupyter-first lab with a live eBPF datapath modelled on Cilium's.

    >>> from labkit import Lab          # doctest: +SKIP
    >>> lab = Lab.up("demo")            # doctest: +SKIP
    >>> lab.pod("a1").ip                # doctest: +SKIP
    '198.18.1.11'
"""
from labkit.config import CtTimeouts, DatapathConfig
from labkit.errors import LabkitError
from labkit.net.topology import Topology

__version__ = "0.1.0"
__all__ = ["Lab", "Topology", "DatapathConfig", "CtTimeouts", "LabkitError", "__version__"]


def __getattr__(name: str):
    # Lab pulls in pyroute2; import it only when asked for, so `labkit ct list` stays quick.
    if name == "Lab":
        from labkit.lab import Lab

        return Lab
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")
