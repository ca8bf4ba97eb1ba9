"""The unprivileged side: what a notebook kernel and the ``labkit`` command use to reach labkitd.

Like ``cilium-dbg`` beside cilium-agent, nothing here needs root: every lab operation is one
request to labkitd (:mod:`labkit.door`) on its unix socket, and what comes back (rows, flows,
steps) is decoded into the same typed objects the datapath side uses.
"""

from labkit.client.lab import Lab, PodHandle, NodeHandle, ExternalHandle, TcpConn  # noqa: E402

__all__ = ["Lab", "PodHandle", "NodeHandle", "ExternalHandle", "TcpConn"]
