"""The master: the coordinator, its parts (``control``) and the gRPC server.

The coordinator (:mod:`.coordinator`: registration, the barrier, heartbeats, the run's end)
is joined from desks that share its lock: :mod:`.state_desk` serves the run's state,
:mod:`.host_desk` the host agents and the scheduler's job, :mod:`.stack_desk` the stacks.

It imports the record and the wire, never the worker runtime: a worker host does not load
the master, and the master knows a worker only through the protocol.
"""
