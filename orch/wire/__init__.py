"""The wire: what a master and its clients share over gRPC.

The generated protocol (``_proto``), the one place a gRPC error becomes a message
(``rpc``), the token and TLS (``auth``), addresses and ports (``net``), the rank record
mapped to the protocol (``ranks``), the limits both ends hold a call to (``limits``), the
client (``client``), and a Slurm gang's dial-back channel, in clear or TLS (``channel``).
It imports only ``orch.errors`` and ``orch.wire.states`` of orch.
"""
