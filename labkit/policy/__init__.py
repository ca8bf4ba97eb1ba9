"""Network policy without a kernel: labels and identities (:mod:`.identity`),
CiliumNetworkPolicy parsing (:mod:`.rules`), toFQDNs ``matchPattern`` (:mod:`.matchpattern`),
and resolution into per-endpoint policy map entries (:mod:`.resolve`), all as Cilium v1.16
does them. The map layout itself is :mod:`labkit.maps.policy`.
"""
