"""What happened in a lab: the datapath's trace records and the evidence journal.

- :mod:`labkit.observe.monitor` — the process that drains the trace ring buffers to a file;
- :mod:`labkit.observe.trace` — trace records decoded into flows;
- :mod:`labkit.observe.ring` — the Hubble ring: the records Cilium's aggregation would have reported, lost events;
- :mod:`labkit.observe.hubble` — its entries as ``hubble observe`` prints them, and its filters;
- :mod:`labkit.observe.evidence` — the journal of steps, snapshots and runs that checks read.
"""
__all__: list[str] = []
