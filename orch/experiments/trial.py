"""One config of a sweep and the run that ran it: :class:`Trial`.

A trial is what the scheduler starts, what an earlier execution of the sweep can stand in
for, and what a row of the results is read from: its run while it is live here, its run dir
once it ended (or when it was reused). Beside the run states its run goes through, a trial
has two of its own, :data:`QUEUED` and :data:`CANCELLED`. A trial its sweep's pruner stopped
ends PRUNED, a run state, with the step it was judged at (``pruned_at``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orch.errors import OrchError
from orch.experiments.metrics import default_mode, last_value, nonfinite, summarize
from orch.launchers.loaded import LoadedRun, load_run
from orch.launchers.run import Run
from orch.record.checkpoint_index import Checkpoint, best_checkpoint
from orch.record.values import Returned
from orch.wire.client import StateMirror
from orch.wire.limits import OWN_METRICS

History = dict[str, dict[int, dict[str, list[float]]]]

# A trial's own states, beside the run states its run goes through.
QUEUED = "QUEUED"  # not started yet (or, under orch.SHA, to run again past the rung it went on from)
CANCELLED = "CANCELLED"  # never started: the sweep was stopped, or max_failures was reached
PAUSED = "PAUSED"  # under orch.SHA: its run ended at a rung, gave its slot up, and waits for the decision


@dataclass
class Trial:
    """One config of a sweep and the run that ran it (``run`` here, or ``run_dir`` on disk)."""

    index: int
    config: dict[str, Any]
    key: str
    state: str = QUEUED
    run: Run | None = None
    run_dir: Path | None = None
    reused: bool = False  # it succeeded in an earlier execution of the same sweep
    ended: bool = False  # its run ended and its record is written (or it never ran and never will)
    failure: str = ""
    error: str = ""  # the root cause's traceback
    started: float = 0.0  # unix seconds
    duration: float = 0.0  # from its launch to its record, the pool's cold start included
    pool_start: float = 0.0  # of which: seconds its launch spent starting the workers' pool
    pruned_at: int | None = None  # the step its pruner stopped it at (it runs on until its ranks agree)
    pruned_time: float = 0.0  # when (unix seconds)
    reported: dict[int, float] = field(default_factory=dict)  # step -> the metric its pruner was fed
    resume_from: Path | None = None  # an earlier run's checkpoints it starts from
    held_at: int | None = None  # the rung (step) it waits at for a synchronous pruner's decision
    held_since: float = 0.0  # since when (monotonic seconds)
    pausing: bool = False  # its run is stopping at that rung to give its slot up (orch.SHA)
    earlier_runs: list[str] = field(default_factory=list)  # run ids of its runs paused at a rung
    earlier_steps: int = 0  # the steps those runs reached
    paused_steps: int = 0  # the step its run paused at reached (it moves to earlier_steps if it runs again)
    number: int | None = None  # its Optuna trial's number, when a study drives the sweep
    _loaded: LoadedRun | None = field(default=None, repr=False)
    _returned: Returned | None = field(default=None, repr=False)

    @property
    def run_id(self) -> str:
        if self.run is not None:
            return self.run.run_id
        return self.run_dir.name if self.run_dir is not None else ""

    @property
    def done(self) -> bool:
        return self.ended

    @property
    def best_checkpoint(self) -> Checkpoint | None:
        """Its run's best checkpoint (path, step, value; see ``run.best_checkpoint``), or None."""
        return best_checkpoint(self.run_dir / "checkpoints") if self.run_dir is not None else None

    def load(self) -> LoadedRun:
        """The trial's run read back from its run dir."""
        if self.run_dir is None:
            raise OrchError(f"config {self.index} of the sweep has not started: it has no run dir yet")
        if self._loaded is None or not self.done:
            self._loaded = load_run(self.run_dir)
        return self._loaded

    @property
    def value(self) -> Any:
        """What rank 0's training function returned in this trial's run (None until it ended,
        or when it returned None); see :attr:`orch.RunResult.value`."""
        return self.returned().value if self.ended and self.run_dir is not None else None

    @property
    def values(self) -> list[Any]:
        """What every rank returned in this trial's run, in rank order (see :attr:`value`)."""
        return self.returned().values if self.ended and self.run_dir is not None else []

    def returned(self) -> Returned:
        m = self.load().state()
        if self._returned is None or self._returned.attempt != m.attempt:
            self._returned = Returned(self.run_dir, m.world_size, m.attempt)
        return self._returned

    def adopt(self, run_dir: Path, loaded: LoadedRun, state: str, started: float, duration: float) -> None:
        """Take the run an earlier execution of the sweep made of this config as this trial's."""
        self._loaded = loaded
        self.state, self.reused, self.run_dir = state, True, run_dir
        self.ended = True
        self.started = started
        self.duration = duration

    def source(self) -> Run | LoadedRun | None:
        """What to watch: the live run, else the run on disk, else nothing yet."""
        if self.run is not None:
            return self.run
        return self.load() if self.run_dir is not None else None

    def mirror(self) -> StateMirror | None:
        src = self.source()
        return src.state() if src is not None else None

    def history(self) -> History:
        src = self.source()
        return src.history() if src is not None else {}

    def summary(self, modes: dict[str, str] | None = None) -> dict[str, Any]:
        """The row of :meth:`Sweep.results` for this trial."""
        mirror = self.mirror()
        row: dict[str, Any] = {
            "index": self.index,
            "run_id": self.run_id,
            "config": dict(self.config),
            "state": self.state,
            "reused": self.reused,
            "steps": min((r.step for r in mirror.ranks), default=0) if mirror else 0,
            "total": mirror.total_steps if mirror else 0,
            "duration": round(self.duration or (mirror.elapsed if mirror else 0.0), 3),
            "failure": self.failure,
            "checkpoint": None,  # its best checkpoint: {"path", "step", "value", "metric"}
            "pool_start": round(self.pool_start, 3),
            "pruned_at": self.pruned_at,
            "earlier_runs": list(self.earlier_runs),  # under orch.SHA: its runs paused at a rung
            "earlier_steps": self.earlier_steps,  # and the steps they ran, beside "steps"
            "final": {},
            "last_step": {},  # the step of each metric's final value (an eval every 50 steps: behind)
            "best": {},
            "nonfinite": {},
        }
        best = self.best_checkpoint
        if best is not None:
            row["checkpoint"] = best.as_dict()
        for metric, by_rank in self.history().items():
            if metric.startswith(OWN_METRICS) and metric not in (modes or {}):
                continue  # the processes' memory is no result to rank configs by, unless asked
            final = last_value(by_rank)
            if final is None:
                continue
            # The final value is what the run ended with, NaN included; the best is over the
            # finite points; where it first went NaN or inf is kept beside them.
            row["final"][metric] = final
            row["last_step"][metric] = max(s["step"][-1] for s in by_rank.values() if s["step"])
            _, mean, _, _ = summarize(by_rank)
            if len(mean):
                mode = (modes or {}).get(metric) or default_mode(metric)
                row["best"][metric] = float(mean.max() if mode == "max" else mean.min())
            bad = nonfinite(by_rank)
            if bad is not None:
                row["nonfinite"][metric] = bad
        return row
