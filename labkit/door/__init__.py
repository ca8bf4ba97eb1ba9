"""labkitd: the one privileged door.

Every privileged act of a lab passes through this package: one root service per machine
(:mod:`labkit.door.daemon`) serves an API on a unix socket (:mod:`labkit.door.api`), knows who is
asking (``SO_PEERCRED``, :mod:`labkit.door.owners`), lets each user see and touch only their own
labs, runs the processes a user starts in a pod as that user with exactly ``CAP_NET_RAW`` and
``CAP_NET_ADMIN`` (:mod:`labkit.door.sandbox`), and records the evidence checks grade where the
learner cannot write it. Its clients (:mod:`labkit.client`: notebooks, the ``labkit`` command) run
without root, as ``cilium-dbg`` and Hubble are cilium-agent's clients.
"""
