"""What the master accepts in one call: the limits both ends of the wire hold a request to.

The master's checks (:mod:`orch.master.control.validate`) refuse a request past them; a
worker or host agent reads them here to stay within them.
"""

from __future__ import annotations

MAX_ID_LEN = 256
MAX_METRICS_PER_RANK = 64
MAX_ERROR_LEN = 64 * 1024  # a rank's reported error is cut to this
MAX_BEATS_PER_BATCH = 256  # heartbeats in one host agent's SendHostHeartbeats call
MAX_SECTIONS = 32  # ctx.section names per heartbeat, and per rank and run
MORE_SECTIONS = "(other sections)"  # where a rank's names past MAX_SECTIONS - 1 are timed together
