"""The scheduler's job a run's ranks run in (a Slurm batch job), as the launcher last saw it.

The launcher asks the scheduler every few seconds (``squeue``) and passes on every answer;
most say nothing new. A change of state, of the scheduler's reason (why it still queues) or of
the nodes is news for the event log; the same answer again is not, so a job that queues for an
hour is a handful of events, not thousands.
"""

from __future__ import annotations

from orch.wire._proto import orchestrator_pb2 as pb


class JobWatch:
    """The last word on the run's job (None: the run is not a scheduler's job)."""

    def __init__(self) -> None:
        self.job: pb.ClusterJob | None = None

    def update(self, job: pb.ClusterJob) -> str | None:
        """Keep the scheduler's latest word; return the event it makes (None: nothing changed)."""
        before, self.job = self.job, job
        said = (job.state, job.reason, job.nodes)
        if before is not None and (before.state, before.reason, before.nodes) == said:
            return None
        where = f" on {job.nodes}" if job.nodes else ""
        why = f" ({job.reason})" if job.reason and job.reason != "None" else ""  # squeue's "no reason"
        return f"{job.scheduler} job {job.job_id} {job.state}{why}{where}"
