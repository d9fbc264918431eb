"""What the master accepts in one call: the limits both ends of the wire hold a request to.

The master's checks (:mod:`orch.master.control.validate`) refuse a request past them; a
worker or host agent reads them here to stay within them: ``ctx.log`` refuses a metric name
past them at the call, the heartbeat thread splits its backlog into beats the master takes,
and a host agent splits its ranks' beats into calls under the message limit. The README's
list of caps (docs/python-api.md, "Caps") names each one.
"""

from __future__ import annotations

MAX_ID_LEN = 256
MAX_NAME_LEN = 256  # characters of one metric name
# Different metric names one rank logs over a run (orch's own, rank/memory and
# rank/cuda_memory, count too): a per-layer gradient norm of a large model fits.
MAX_METRICS_PER_RANK = 2048
MAX_ERROR_LEN = 64 * 1024  # a rank's error is cut to this (its head and tail kept)
MAX_REASON_LEN = 1024  # why a rank's points were dropped, as its heartbeat says
MAX_BEATS_PER_BATCH = 256  # heartbeats in one host agent's SendHostHeartbeats call
MAX_SECTIONS = 32  # ctx.section names per heartbeat, and per rank and run
MORE_SECTIONS = "(other sections)"  # where a rank's names past MAX_SECTIONS - 1 are timed together
# Values (points of one metric) in one heartbeat: at most 26 bytes each on the wire (a step
# of 10 bytes, a value and a time of 8), so a beat with the longest names of every metric
# stays under 5 MiB, and three of them fit in one host agent's call.
MAX_VALUES_PER_BEAT = 150_000
# A host agent's call carries beats up to this many bytes (one bigger beat goes alone): under
# the 16 MiB a master takes in one message (orch/master/server.py).
MAX_BATCH_BYTES = 12 * 1024 * 1024


def clip(text: str, limit: int = MAX_ERROR_LEN) -> str:
    """``text`` in at most ``limit`` characters: its head and its tail, where a traceback
    names the exception and its last frames, with what was cut said between them."""
    if len(text) <= limit:
        return text
    note = f"\n... [{len(text) - limit:,} characters cut: the error was {len(text):,} long] ...\n"
    keep = max(limit - len(note), 0)
    head = keep // 2
    return text[:head] + note + text[len(text) - (keep - head) :]


OWN_METRICS = "rank/"  # the prefix of the metrics orch logs itself (rank/memory): not the model's
