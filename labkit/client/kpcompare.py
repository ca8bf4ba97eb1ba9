"""Lab 09's measurement of kube-proxy's iptables mode against the eBPF agent, through labkitd.

The measuring runs on the privileged side (:mod:`labkit.lab.kpcompare`, in two second labs of yours,
``<lab>-bipt`` and ``<lab>-bebpf``); this is its handle, with the same calls, one request each, so the
measurement spreads over cells. ``progress(done, total, text)`` is called for each step the request made.

    >>> run = ServiceModes((100, 1000), prefix=lab.name, connects=50).up()   # doctest: +SKIP
    >>> run.measure(100)["ebpf"]["services_in_agent"]                        # doctest: +SKIP
    100
"""
from __future__ import annotations

from labkit.client.session import current_lab

__all__ = ["ServiceModes"]


class ServiceModes:
    """:class:`labkit.lab.kpcompare.ServiceModes`, run by labkitd for the lab ``prefix`` names (your lab)."""

    def __init__(self, sizes, progress=None, prefix: str | None = None, rounds: int = 5, connects: int = 50,
                 tracing: bool = False, stall_sizes=None, lab=None):
        self.lab = lab or current_lab()
        if prefix is not None and prefix != self.lab.name:
            from labkit.client.lab import Lab

            self.lab = Lab.attach(prefix, self.lab.door)
        self.sizes = tuple(sorted(sizes))
        self.stall_sizes = tuple(sorted(set(self.sizes if stall_sizes is None else stall_sizes)))
        self.progress = progress
        self._args = {"sizes": list(self.sizes), "rounds": rounds, "connects": connects, "tracing": tracing,
                      "stall_sizes": list(self.stall_sizes)}
        self.names: dict[str, str] = {}

    def _call(self, verb: str, **args):
        got = self.lab._call(verb, **args)
        if self.progress is not None:
            for line in got["progress"]:
                count, _, text = line.partition("] ")
                done, _, total = count.lstrip("[").partition("/")
                self.progress(int(done), int(total), text)
        return got["value"]

    def up(self) -> "ServiceModes":
        """Bring both labs up (native routing, GC timer off), removing leftovers first."""
        self.names = self._call("kp.up", **self._args)["names"]
        return self

    def measure(self, n: int) -> dict:
        """Grow both labs to ``n`` services and measure the first packet and adding one endpoint there."""
        return self._call("kp.measure", n=int(n))

    def stall(self) -> dict:
        """The stall at the size measured last."""
        return self._call("kp.stall")

    def result(self) -> dict:
        """Everything measured so far (the keys :mod:`labkit.lab.kpcompare` lists)."""
        return self._call("kp.result")

    def down(self) -> None:
        """Remove both labs."""
        self._call("kp.down")

    def __enter__(self) -> "ServiceModes":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()
