"""The one contract of every run a user holds, and how a run ended.

A run launched here (:class:`~orch.launchers.run.Run`, on this machine or on Slurm),
detached (:class:`~orch.launchers.detached.start.DetachedRun`), attached by address
(:class:`~orch.launchers.attached.AttachedRun`) or loaded from its run dir
(:class:`~orch.launchers.loaded.LoadedRun`) answers the same calls, with the same types::

    run.run_id, run.run_dir        its id; its run dir (None for a master known by address alone)
    run.state()   -> StateMirror   the run as its master (or its record) says, up to date
    run.history() -> {metric: {rank: {"step": [...], "value": [...]}}}
    run.wait()    -> RunResult     blocks until it ended (at once for an ended run);
                                   raises orch.RunFailed, naming the root cause, if it failed
    run.stop()    -> RunState      asks its ranks to end after their step (no-op once ended)
    run.best_checkpoint            its best checkpoint: path, step, value (None: no checkpoint)
    run.to_mlflow()                the ended run as one MLflow run (config, per-rank metrics, mean)
    run.log_files(), run.panel(), run.close(), ``with run: ...``

The panel reads a run through the half of this contract that a run read from disk has too
(:class:`~orch.record.source.RunSource`): ``connect()`` (a client to poll, or None when
there is nothing to poll) and ``final_state()`` (the state once it ended, else None).
"""

from __future__ import annotations

import threading
from abc import ABC
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orch._viewable import Viewable
from orch.errors import OrchError, RunFailed
from orch.launchers.kernel_wait import block_until
from orch.record.checkpoint_index import Checkpoint, best_checkpoint
from orch.record.mlflow_export import export_mlflow
from orch.record.rundir import RunRecord
from orch.record.source import RunSource
from orch.record.values import Returned
from orch.wire.client import StateMirror
from orch.wire.stacks import Stacks, stacks_of
from orch.wire.states import RunState

# What a process that answers for a run exits with (orch run, orch master, a detached run's
# supervisor): 0 succeeded, 1 failed, 3 stopped (by a user, or by a sweep's pruner).
EXIT_CODES = {RunState.SUCCEEDED: 0, RunState.FAILED: 1, RunState.STOPPED: 3, RunState.PRUNED: 3}


def exit_code(state: RunState) -> int:
    """The exit code for a run that ended in ``state`` (1 for one that did not end)."""
    return EXIT_CODES.get(state, 1)


@dataclass
class RunResult:
    """How a finished run ended."""

    run_id: str
    state: RunState
    world_size: int
    elapsed: float
    steps: list[int]
    final_loss: list[float]
    param_checksums: list[str]
    run_dir: Path | None  # None for a run known only by its master's address
    returned: Returned | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, mirror: StateMirror, run_dir: Path | None) -> RunResult:
        """How the run ``mirror`` shows ended; :func:`failure_of` first for a failed one."""
        return cls(
            run_id=mirror.run_id,
            state=mirror.state,
            world_size=mirror.world_size,
            elapsed=mirror.elapsed,
            steps=[r.step for r in mirror.ranks],
            final_loss=[r.loss for r in mirror.ranks],
            param_checksums=[r.param_checksum for r in mirror.ranks],
            run_dir=run_dir,
            returned=Returned(run_dir, mirror.world_size, mirror.attempt),
        )

    @property
    def value(self) -> Any:
        """What rank 0's training function returned (None if it returned None), on the CPU:
        ``model.load_state_dict(result.value)``. Loaded from the run dir when first asked for;
        a value that could not come back (it did not pickle, or was over ``value_cap``) raises
        :class:`orch.record.values.ValueNotReturned`, naming the rank, its type and why."""
        return self.returned.value if self.returned is not None else None

    @property
    def values(self) -> list[Any]:
        """What every rank's training function returned, in rank order (see :attr:`value`)."""
        return self.returned.values if self.returned is not None else [None] * self.world_size


def failure_of(mirror: StateMirror) -> RunFailed:
    """The error for a failed run read from its state (a master elsewhere, or its run dir)."""
    return RunFailed(
        f"run {mirror.run_id} failed: {mirror.failure}",
        rank=mirror.root_cause_rank if mirror.root_cause_rank >= 0 else None,
        exit_code=mirror.root_cause_exit_code or None,
        traceback=mirror.root_cause_error,
        state=mirror,
    )


def still_running(run_id: str, state: str) -> str:
    return (
        f"wait() was interrupted; run {run_id} is still {state}: run.stop() (or the panel's Stop) "
        "ends it gracefully, run.close() ends it now"
    )


class RunHandle(RunSource, Viewable, ABC):
    """What every kind of run implements (see the module docstring); what the panel reads of
    it is :class:`~orch.record.source.RunSource`, the half a run read from disk has too."""

    @property
    def best_checkpoint(self) -> Checkpoint | None:
        """Its best checkpoint on disk (``.path``, ``.step``, ``.value``, ``.metric``): the best by
        the value it was saved with, or the newest when none has one; None without any."""
        return best_checkpoint(self.run_dir / "checkpoints") if self.run_dir is not None else None

    def wait(self, timeout: float | None = None, interval: float = 0.5) -> RunResult:
        """Block until the run ends (at once if it has); raise :class:`orch.RunFailed` if it failed.

        The panel's Stop button works while a cell waits here, in every notebook frontend
        (:mod:`orch.launchers.kernel_wait`). Interrupting the kernel returns control and leaves the
        run going (the message says how to stop it).
        """
        block_until(
            self._ended(),
            timeout,
            interval=interval,
            interrupted=lambda: still_running(self.run_id, self._last_state()),
            timed_out=lambda: f"run {self.run_id} still {self._last_state()} after {timeout}s",
        )
        if self._panel is not None:
            self._panel.refresh()  # the final state is drawn before the waiting cell goes on
        return self._result()

    def _result(self) -> RunResult:
        """How the run ended; raises :class:`orch.RunFailed`, naming the root cause, for a failed one."""
        mirror = self._final()
        if mirror.state is RunState.FAILED:
            raise failure_of(mirror)
        return RunResult.of(mirror, self.run_dir)

    # -- what a kind of run gives wait() -------------------------------------------------------
    def _ended(self) -> threading.Event | Callable[[], bool]:
        """What says the run ended: an event set then, or a check (default: its state, asked)."""

        def ended() -> bool:
            self._seen = self.state()
            return self._seen.state.done

        return ended

    def _last_state(self) -> str:
        """The state the run was last seen in, for a wait's messages."""
        seen: StateMirror | None = getattr(self, "_seen", None)
        return seen.state.value if seen is not None else "running"

    def _final(self) -> StateMirror:
        """The run's state once it ended (default: its state, asked)."""
        return self.state()

    def stacks(self, timeout: float = 3.0) -> Stacks:
        """Every running rank's training-thread stack, asked for now and grouped by frame
        (``print(run.stacks())``); a run that ended shows the stacks last taken."""
        client = self.connect()
        if client is not None:
            with client:
                if not self.state().state.done:
                    return stacks_of(client.stacks(wait=timeout))
        mirror = self.state()
        return Stacks(grouped=mirror.stacks or f"no stacks: run {mirror.run_id} is {mirror.state.value}")

    def to_mlflow(
        self, tracking_uri: str | None = None, experiment: str = "orch", *, name: str | None = None
    ) -> str:
        """Write the ended run as one MLflow run (named ``name``, default its run id) in
        ``experiment`` at ``tracking_uri`` (None: MLflow's own); returns its MLflow run id.

        The config as params, each rank's metrics (``rank0/loss``) and their mean (``loss``)
        with their steps, the state and root cause as tags (see :mod:`orch.record.mlflow_export`).
        Written here, from the run dir, once; exporting again replaces it."""
        run_dir = self.run_dir
        if run_dir is None:
            raise OrchError(
                f"run {self.run_id} has no run dir here (a master known by its address): export it "
                "where its run dir is, with orch.load_run(path).to_mlflow()"
            )
        if self.final_state() is None:
            raise OrchError(
                f"run {self.run_id} is still {self.state().state.value}: export it once it ended (run.wait())"
            )
        source = self if isinstance(self, RunRecord) else run_dir
        return export_mlflow(
            [(name or self.run_id, source)], tracking_uri=tracking_uri, experiment=experiment, load=RunRecord
        )[0]

    def close(self) -> None:
        """Let go of what this handle holds (its panel's poller); a run launched here also ends."""
        if self._panel is not None:
            self._panel.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
