"""The control plane: what cilium-agent (or kube-proxy) would write for a lab.

- :mod:`labkit.agent.endpoints` — endpoint and ipcache entries of pods and nodes;
- :mod:`labkit.agent.services` — Services: model, ids, store, plan and writers;
- :mod:`labkit.agent.kubeproxy` — kube-proxy's iptables rules, the other Service writer;
- :mod:`labkit.agent.gc` — the CT garbage collector.
"""
__all__: list[str] = []
