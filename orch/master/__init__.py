"""The master: the coordinator, its parts (``control``) and the gRPC server.

It imports the record and the wire, never the worker runtime: a worker host does not load
the master, and the master knows a worker only through the protocol.
"""
