"""The master: the coordinator, its parts (``control``) and the gRPC server.

The coordinator (:mod:`.coordinator`: registration, the barrier, heartbeats, host agents,
stacks, the run's state served and its end) owns the run's parts and joins them under one
lock; it is made from a :class:`~orch.master.control.plan.RunPlan`.

It imports the record and the wire, never the worker runtime: a worker host does not load
the master, and the master knows a worker only through the protocol.
"""
