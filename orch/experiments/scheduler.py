"""The thread that runs a sweep's configs: :class:`Scheduler`.

It takes turns until every trial ended: it folds the states of the runs that go into their
trials, closes the runs that ended (recording a failed one with its root cause) and starts
the next queued configs on the warm forkserver, ``parallel`` at a time (a search that draws
its configs as it goes adds one when a slot frees: ``more``). With a pruner it reads each
running trial's metric (the mean over its ranks, at the steps the pruner asks for) and stops a
trial the pruner prunes: through its master, so every rank ends at the same step, and the run
ends PRUNED; its slot goes to the next trial at once. Once ``max_failures`` runs failed, or the
sweep is stopped or closed, it starts no more: the queued trials are CANCELLED.

What the pruner reads and decides at the rungs, and how a trial waits at one, is
:mod:`orch.experiments.rungs`.
:class:`~orch.experiments.sweep.Sweep` is its face; stopping and closing go through here,
under the lock the thread takes its turns under.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from orch.errors import ConfigError
from orch.experiments.pruning import Pruner
from orch.experiments.rungs import Rungs
from orch.experiments.trial import CANCELLED, PAUSED, QUEUED, Trial
from orch.launchers.run import Run
from orch.launchers.spec import LaunchSpec
from orch.record.owned import open_own
from orch.record.writes import own_dir, private_dir
from orch.wire.states import RunState

log = logging.getLogger("orch.experiments.sweep")  # the sweep's messages, under the one name


class Scheduler:
    """Starts the trials of sweep ``name`` (``specs[i]`` launches ``trials[i]``) from a thread."""

    def __init__(
        self,
        name: str,
        trials: list[Trial],
        specs: list[LaunchSpec],
        parallel: int,
        max_failures: int | None,
        *,
        pruner: Pruner | None = None,
        more: Callable[[], bool] | None = None,
        order: list[int] | None = None,
        on_ended: Callable[[Trial], None] | None = None,
        on_turn: Callable[[], None] | None = None,
        size: int | None = None,
    ) -> None:
        self.name = name
        self.trials = trials
        self.specs = specs
        self.parallel = parallel
        self.max_failures = max_failures
        self.pruner = pruner
        self.more = more  # adds one more queued trial (and its spec); False when the search is done
        self.order = order  # the trials' indices in the order they start (None: index order)
        self.on_ended = on_ended  # a trial ended (the sweep tells its search, writes its folder)
        self.on_turn = on_turn  # after each turn, under the lock
        self.size = size  # the trials the sweep will have (a search draws them as it goes)
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.finished = threading.Event()
        self.thread: threading.Thread | None = None
        # The pruner's side: what it reads and decides at the rungs, and the trials held there.
        self._rungs = (
            None
            if pruner is None
            else Rungs(
                name,
                trials,
                pruner,
                size=size,
                draws=more is not None,
                running=self._running,
                full=lambda: self._busy() >= self.parallel,
                tell_ended=self._tell_ended,
                wake=self.wake,
            )
        )

    def start(self) -> None:
        self.thread = threading.Thread(target=self._schedule, name=f"orch-sweep-{self.name}", daemon=True)
        self.thread.start()

    @property
    def done(self) -> bool:
        return self.finished.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether every trial ended within ``timeout`` seconds."""
        return self.finished.wait(timeout)

    def snapshot(self) -> list[Trial]:
        """The trials, taken between two of the thread's turns."""
        with self.lock:
            return list(self.trials)

    def _schedule(self) -> None:
        """Take turns until every config ended: collect the runs that ended, start the next."""
        try:
            while True:
                with self.lock:
                    self._collect()
                    if self._rungs is not None and self._rungs.pruner.synchronous:
                        self._rungs.settle()
                    if not self.stopping.is_set():
                        self._start_next()
                    if self.on_turn is not None:
                        self.on_turn()
                    if all(t.done for t in self.trials):
                        break
                self.wake.wait(0.1 if self.pruner is None else 0.05)  # a pruner's rungs are read sooner
                self.wake.clear()
        except Exception as e:  # a bug here must not leave the sweep looking busy forever
            log.exception("sweep %s: the scheduler failed", self.name)
            with self.lock:
                self._cancel_queued(f"the sweep's scheduler failed: {e}")
                for trial in self._running():
                    with contextlib.suppress(Exception):
                        self._ended(trial)
        finally:
            self.finished.set()

    def _running(self) -> list[Trial]:
        return [t for t in self.trials if t.run is not None and not t.done]

    def _busy(self) -> int:
        """The slots in use: a pruned or pausing trial's ranks are on their way out and hold none."""
        return sum(t.pruned_at is None and not t.pausing for t in self._running())

    def _failures(self) -> int:
        return sum(t.state == RunState.FAILED.value for t in self.trials)

    def _start_next(self) -> None:
        failures = self._failures()
        if self.max_failures is not None and failures >= max(1, self.max_failures):
            self._cancel_queued(
                f"the sweep started no more runs after {failures} failure{'s' if failures > 1 else ''} "
                f"(max_failures={self.max_failures})"
            )
            return
        if self._rungs is not None:
            self._rungs.pause_held()
        while self._busy() < self.parallel:
            queue = (self.trials[i] for i in self.order) if self.order is not None else iter(self.trials)
            trial = next((t for t in queue if t.state == QUEUED), None)
            if trial is None and (self.more is None or not self.more()):
                return
            trial = trial or self.trials[-1]
            spec = self.specs[trial.index]
            if trial.run_dir is not None and not trial.reused:  # it paused at a rung, and goes on
                trial.earlier_runs.append(trial.run_dir.name)
                trial.earlier_steps += trial.paused_steps
                latest = trial.run_dir / "checkpoints" / "latest"
                trial.resume_from = latest.parent if latest.is_file() else None
            run = Run(spec)
            trial.run, trial.run_dir, trial.state, trial.started = (
                run,
                run.run_dir,
                RunState.PENDING.value,
                trial.started if trial.earlier_runs else time.time(),
            )
            try:
                if trial.resume_from is not None:
                    _carry_checkpoints(trial.resume_from, run.run_dir / "checkpoints")
                rungs = self.pruner.rungs() if self.pruner is not None else []
                if self.pruner is not None and rungs:
                    # The ranks wait at each rung for the decision (not at those a resumed trial passed).
                    due = self.pruner.next_step(trial.index, 0)
                    passed = max((s for s in rungs if due is None or s < due), default=0)
                    run.coordinator.hold_at(rungs, passed)
                run.start()
            except Exception as e:  # recorded with the config; the others go on
                self._ended(trial, error=str(e))

    def _collect(self) -> None:
        """Fold the runs' states into their trials; close the runs that ended."""
        for trial in self.trials:
            run = trial.run
            if run is None or trial.done:
                continue
            if run.done:
                stopped_at_rung = trial.held_at is not None and run.coordinator.state is RunState.STOPPED
                if trial.pausing or stopped_at_rung:  # a stop of ours at a rung: paused
                    self._paused(trial)
                else:
                    self._ended(trial)
            else:
                trial.state = run.coordinator.state.value
                rungs = self._rungs
                judged = trial.pruned_at is None and trial.held_at is None
                if rungs is not None and judged and trial.state == RunState.RUNNING.value:
                    rungs.judge(trial, run)

    def _tell_ended(self, trial: Trial) -> None:
        if self.on_ended is not None:
            try:
                self.on_ended(trial)
            except Exception:  # the search's own trouble must not stop the sweep's runs
                log.exception("sweep %s: recording how config %d ended failed", self.name, trial.index)

    def _ended(self, trial: Trial, error: str = "") -> None:
        run = trial.run
        assert run is not None
        with contextlib.suppress(Exception):
            run.close()  # the master's port and its server threads go; the record stays on disk
        coord = run.coordinator
        trial.state, trial.ended = coord.state.value, True
        if trial.pruned_at is not None and coord.state is RunState.STOPPED:
            # pruned while a stop of its run was already on its way (the run records STOPPED)
            trial.state = RunState.PRUNED.value
        trial.duration = time.time() - trial.started
        trial.pool_start = run.group.pool_start_seconds  # a cold pool's start, within duration
        if coord.state is RunState.FAILED:
            cause = coord.root_cause
            trial.failure = error or coord.failure
            trial.error = cause.error if cause else ""
            log.warning(
                "sweep %s: config %d %s failed: %s", self.name, trial.index, trial.config, trial.failure
            )
        self._tell_ended(trial)

    def _paused(self, trial: Trial) -> None:
        """A trial's run stopped at its rung: the trial waits, without a slot, for the decision."""
        run = trial.run
        assert run is not None
        with contextlib.suppress(Exception):
            run.close()
        trial.paused_steps = _steps_run(run)
        trial.run, trial.pausing, trial.state = None, False, PAUSED
        if run.coordinator.state is not RunState.STOPPED:  # it failed or ended on its own meanwhile
            trial.run, trial.held_at = run, None
            self._ended(trial)
        elif self.stopping.is_set():
            self._end_paused(trial, "the sweep was stopped")

    def _end_paused(self, trial: Trial, reason: str) -> None:
        """A trial waiting without a run at its rung ends as its last run did: STOPPED."""
        trial.state, trial.failure, trial.ended, trial.held_at = RunState.STOPPED.value, reason, True, None
        self._tell_ended(trial)

    def _cancel_queued(self, why: str) -> None:
        for t in self.trials:
            if t.state == QUEUED:
                t.state, t.failure, t.ended = CANCELLED, why, True

    def stop(self, which: int | str | Run | None, reason: str) -> None:
        """Stop one run (see :meth:`find`) or, with ``which`` None, all of them and start no more."""
        with self.lock:
            if which is None:
                self.stopping.set()
                self._cancel_queued("the sweep was stopped")
                targets = self._running() + [t for t in self.trials if t.state == PAUSED]
            else:
                targets = [self.find(which)]
            for trial in targets:
                if trial.state == QUEUED:
                    trial.state, trial.failure, trial.ended = CANCELLED, reason, True
                elif trial.state == PAUSED:
                    self._end_paused(trial, reason)
                elif trial.run is not None and not trial.done:
                    trial.run.stop(reason)
        self.wake.set()

    def find(self, which: int | str | Run) -> Trial:
        """The trial of a config's index, of a run id, or of a Run."""
        for t in self.trials:
            if which is t.run or which == t.index or (isinstance(which, str) and which and which == t.run_id):
                return t
        raise ConfigError(
            f"no run {which!r} in sweep {self.name}: pass the index of its config (0 to "
            f"{len(self.trials) - 1}), its run id, or the Run"
        )

    def close(self) -> None:
        """End every run now, start no more, and wait for the thread to see it."""
        self.stopping.set()
        with self.lock:
            self._cancel_queued("the sweep was closed")
            for trial in self._running():
                self._ended(trial)
            for trial in self.trials:
                if trial.state == PAUSED:
                    self._end_paused(trial, "the sweep was closed")
        self.wake.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(60.0)
        self.finished.set()


def _steps_run(run: Run) -> int:
    """The steps the run's slowest rank finished (its record's step count)."""
    with contextlib.suppress(Exception):
        return min((r.step for r in run.coordinator.ranks), default=0)
    return 0


def _carry_checkpoints(src: Path, dst: Path) -> None:
    """Put an earlier run's checkpoints into a new run's dir: its ranks load the newest one
    (``ctx.load_checkpoint``) and ``ctx.steps`` goes on after it, not from step 0."""
    private_dir(dst.parent)
    with own_dir(dst) as folder:
        for f in sorted(src.iterdir()):
            if f.name.endswith(".tmp") or f.is_symlink() or not f.is_file():
                continue
            with folder.atomic(f.name) as out, open_own(f) as source:
                shutil.copyfileobj(source, out)  # the earlier run's own files only, never a link
