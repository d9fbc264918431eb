"""The scheduler's job a run's ranks run in (a Slurm batch job), as the launcher last saw it.

The launcher asks the scheduler every few seconds (``squeue``) and passes on every answer;
most say nothing new. A change of state, of the scheduler's reason (why it still queues) or of
the nodes is news for the event log; the same answer again is not, so a job that queues for an
hour is a handful of events, not thousands.
"""

from __future__ import annotations

from orch.wire.model import JobView


class JobWatch:
    """The last word on the run's job (None: the run is not a scheduler's job)."""

    def __init__(self) -> None:
        self.job: JobView | None = None

    def update(self, job: JobView) -> str | None:
        """Keep the scheduler's latest word; return the event it makes (None: nothing changed)."""
        before, self.job = self.job, job
        return job.news(before)
