"""Describe a lab's network, then realise it: the stage below everything else.

- :mod:`labkit.net.topology` — nodes, pods, links and addresses as pure data;
- :mod:`labkit.net.netns` — entering network namespaces and cgroups;
- :mod:`labkit.net.ledger` — what a lab created, recorded before it is created;
- :mod:`labkit.net.build` — namespaces, veths, VXLAN, routes and sysctls from a topology;
- :mod:`labkit.net.podserver` / :mod:`labkit.net.podclient` — the processes inside each pod.
"""
__all__: list[str] = []
