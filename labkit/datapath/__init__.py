"""The kernel side of a lab: build each node's BPF programs, load, attach, pin.

- :mod:`labkit.datapath.source` composes a node's translation unit and macros;
- :mod:`labkit.datapath.loader` compiles it with BCC inside the node's
  namespace, attaches the programs with pyroute2 and pins the maps (it runs as
  a child process, one per node, so nodes build in parallel);
- :mod:`labkit.datapath.tc` holds the tc verbs both sides use.
"""
from labkit.datapath.source import BPF_DIR, NodeBuild, PROGRAMS, node_build

__all__ = ["BPF_DIR", "NodeBuild", "PROGRAMS", "node_build"]
