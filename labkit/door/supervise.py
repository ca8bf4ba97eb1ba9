"""labkitd watching the labs' agents: a lab's agent that died is started again, as the kubelet restarts a crashed
cilium-agent.

Every few seconds labkitd looks at the labs it holds that it supervises — every user's lab, and root's labs
brought up through it — and restarts the agent of any whose agent process has ended (``labkit agent restart``:
the new agent restores the Services from the journal and the pinned maps). The datapath never waited for it:
established connections and Services kept working meanwhile. A lab that is being changed (its lock taken) is
looked at next time. Root's labs built in a process of their own (the datapath tests) are theirs to mind.
"""
from __future__ import annotations

import sys
import threading

from labkit.door.labs import Labs

__all__ = ["Supervisor", "PERIOD"]

#: Seconds between two looks.
PERIOD = 2.0


class Supervisor(threading.Thread):
    """The thread that restarts dead agents of the labs labkitd supervises."""

    def __init__(self, labs: Labs, period: float = PERIOD, log=None):
        super().__init__(name="supervise", daemon=True)
        self.labs, self.period = labs, period
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.stopping = threading.Event()
        self.restarts: list[str] = []  #: keys whose agent it restarted, in order

    def run(self) -> None:
        while not self.stopping.wait(self.period):
            self.once()

    def once(self) -> None:
        """One look at every supervised lab (and the ended sandboxes' exits collected)."""
        from labkit.door import sandbox

        sandbox.reap()
        for key in list(self.labs.supervised()):
            held = self.labs.held(key)
            if held is None:
                continue
            lock = self.labs.lock(key)
            if not lock.acquire(blocking=False):
                continue
            try:
                problems = held.lab.health()
                if problems and all(p.startswith("process agent ") for p in problems):
                    held.lab.restart_agent()
                    self.restarts.append(key)
                    self.log(f"labkitd: lab {key}: its agent had ended ({problems[0]}); started a new one")
            except Exception as exc:  # a lab going down meanwhile, or a broken one: looked at next time
                self.log(f"labkitd: lab {key}: could not look after its agent ({type(exc).__name__}: {exc})")
            finally:
                lock.release()
