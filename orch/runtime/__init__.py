"""The worker runtime: what runs in a rank and on a worker host.

The worker process (``worker``), the training context (``context``), the heartbeat
sender, step timing, the launcher watch (``owner``) and the host agent. It imports the
record and the wire, never the master: a worker process loads no gRPC server, no Slurm, no
rich and no ipywidgets.
"""
