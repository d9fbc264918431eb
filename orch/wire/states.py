"""What client and server share of the protocol: the service's name and the state enums.

Clients (the panel, the dashboard, ``orch status``, ``orch.attach``) import this, never
the master's modules.
"""

from __future__ import annotations

from enum import Enum

from orch.wire._proto import orchestrator_pb2 as pb

# The exit code of a worker that ended itself because the run had failed or its master
# vanished: it explains no failure.
EXIT_ABORTED = 70
# What a gang's rank reports when its call was ended because another rank's failed (it
# explains no failure either): the words of orch.errors.CallAborted.
CALL_ENDED = "this rank's part of the gang's call was ended"
# The master's answer to a rank at the start barrier of a run that ended (another rank failed
# first): the rank leaves, and its error explains nothing either.
BARRIER_CLOSED = "the run ended before its start barrier opened"


def describe_exit(code: int) -> str:
    """A process's exit status as people read it: ``exit code 1``, ``signal SIGKILL``."""
    if code < 0:
        import signal

        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Orchestrator"].full_name


class RunState(str, Enum):
    """State of a run.

    PENDING -> RUNNING (every rank registered: the barrier opens)
            | FAILED | STOPPED (a launch that failed or was stopped before it started)
    RUNNING -> SUCCEEDED (every rank finished) | FAILED (a rank failed or was lost)
            | STOPPED (every rank ended, some stopped by themselves)
            | STOPPING (a stop was asked for) | RESTARTING (a rank failed after the group
            made progress, and restarts are left)
    STOPPING -> STOPPED (every rank ended) | FAILED (a rank failed on the way)
    RESTARTING -> PENDING (the next attempt) | FAILED (no restart: ``give_up``)
            | STOPPED (a stop asked for while the group was torn down)
    A stop a sweep's pruner asked for (``StopRun`` with ``prune``) ends PRUNED wherever it
    would have ended STOPPED. SUCCEEDED, FAILED, STOPPED and PRUNED are final. The table is
    :data:`orch.master.control.lifecycle.TRANSITIONS`.
    """

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    RESTARTING = "RESTARTING"
    STOPPING = "STOPPING"
    PRUNED = "PRUNED"

    @property
    def done(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED, RunState.PRUNED)

    @property
    def failing(self) -> bool:
        """A rank failed: every other one must stop now (for good, or for a restart)."""
        return self in (RunState.FAILED, RunState.RESTARTING)


class RankState(str, Enum):
    """State of one rank: REGISTERED -> RUNNING -> SUCCEEDED | FAILED | STOPPED | LOST."""

    REGISTERED = "REGISTERED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    LOST = "LOST"

    @property
    def done(self) -> bool:
        return self in (RankState.SUCCEEDED, RankState.FAILED, RankState.STOPPED, RankState.LOST)


RUN_STATE_PB = {s: getattr(pb, s) for s in RunState.__members__}
RANK_STATE_PB = {s: getattr(pb, "RANK_" + s) for s in RankState.__members__}
RANK_STATE_FROM_PB = {v: RankState(k) for k, v in RANK_STATE_PB.items()}
