"""Typed views of every map family a node pins: one module per family.

- :mod:`labkit.maps.ct` — ``cilium_ct4_global`` / ``cilium_ct_any4_global``
- :mod:`labkit.maps.eps` — ``cilium_lxc`` and ``cilium_ipcache``
- :mod:`labkit.maps.lb` — ``cilium_lb4_services_v2``, ``_backends_v3``, ``_reverse_nat``, ``_affinity``, ``_reverse_sk``
- :mod:`labkit.maps.config` — ``labkit_config`` (lab clock, faults, trace mode)
- :mod:`labkit.maps.base` — :class:`PinnedMap`, the mapping they all share
"""
from labkit.maps.base import PinnedMap
from labkit.maps.ct import CtEntry, CtFlags, CtKey4, CtRow, TupleFlags, diff_rows

__all__ = ["PinnedMap", "CtKey4", "CtEntry", "CtFlags", "CtRow", "TupleFlags", "diff_rows"]
