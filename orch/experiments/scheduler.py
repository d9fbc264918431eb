"""The thread that runs a sweep's configs: :class:`Scheduler`.

It takes turns until every trial ended: it folds the states of the runs that go into their
trials, closes the runs that ended (recording a failed one with its root cause) and starts
the next queued configs on the warm forkserver, ``parallel`` at a time (a search that draws
its configs as it goes adds one when a slot frees: ``more``). With a pruner it reads each
running trial's metric (the mean over its ranks, at the steps the pruner asks for) and stops a
trial the pruner prunes: through its master, so every rank ends at the same step, and the run
ends PRUNED; its slot goes to the next trial at once. Once ``max_failures`` runs failed, or the
sweep is stopped or closed, it starts no more: the queued trials are CANCELLED.

A synchronous pruner (``orch.SHA``) decides a rung only once every trial still in the sweep
reached it. A trial there waits at the rung, holding its slot, while no queued trial wants the
slot and for at most ``HOLD`` seconds (its ranks wait ``GATE_WAIT`` at most); otherwise it is
paused: its run stops at the rung (STOPPED, its checkpoints kept), the trial reads PAUSED, and
if the rung's decision keeps it, it is queued again and runs from its newest checkpoint (from
step 0 without one), past the rungs it passed.
:class:`~orch.experiments.sweep.Sweep` is its face; stopping and closing go through here,
under the lock the thread takes its turns under.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import math
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from orch.errors import ConfigError
from orch.experiments.pruning import Pruner
from orch.experiments.trial import CANCELLED, PAUSED, QUEUED, Trial
from orch.launchers.run import Run
from orch.launchers.spec import LaunchSpec
from orch.record.owned import open_own
from orch.record.store import private_dir
from orch.record.writes import own_dir
from orch.wire.states import RunState

log = logging.getLogger("orch.experiments.sweep")  # the sweep's messages, under the one name

HOLD = 6.0  # seconds a trial waits at a rung, holding its slot, for a synchronous decision


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
                    if self.pruner is not None and self.pruner.synchronous:
                        self._settle(self.pruner)
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
        self._pause_held()
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
                judged = self.pruner is not None and trial.pruned_at is None and trial.held_at is None
                if judged and self.pruner is not None and trial.state == RunState.RUNNING.value:
                    self._judge(trial, run, self.pruner)

    def _judge(self, trial: Trial, run: Run, pruner: Pruner) -> None:
        """Feed the pruner the trial's metric at the steps it asks for (the mean over ranks of
        each rank's value there, or its last one before); stop the trial where it says so."""
        metric = pruner.metric or "loss"
        points = run.coordinator.points
        ranks = [points.get(r, metric) for r in range(run.coordinator.world_size)]
        if any(len(s) == 0 for s in ranks):
            return
        reached = min(s.steps[-1] for s in ranks)
        while (step := pruner.next_step(trial.index, reached)) is not None and step <= reached:
            values = []
            for s in ranks:
                at = bisect.bisect_right(s.steps, step) - 1
                if at < 0:
                    return  # that rank's point is only on disk now: no judgement here
                values.append(s.values[at])
            value = sum(values) / len(values)
            trial.reported[step] = value
            verdict = pruner.report(trial.index, step, value)
            if verdict is None:  # a synchronous pruner: the trial waits at the rung (see _settle)
                trial.held_at, trial.held_since = step, time.monotonic()
                self.wake.set()
                return
            if not verdict:
                run.coordinator.pass_gate(step)
            else:
                self._prune(trial, run, step, pruner)
                return

    def _settle(self, pruner: Pruner) -> None:
        """A synchronous pruner decides the rungs every trial still in the sweep reached; the
        trials waiting at a decided rung go on (past the gate, or queued again) or end PRUNED."""
        alive = {t.index for t in self.trials if not t.done and t.pruned_at is None}
        size = max(self.size or 0, len(self.trials)) if self.more is not None else len(self.trials)
        alive |= set(range(len(self.trials), size))  # not drawn yet: the search will draw them
        pruner.settle(alive, size)
        moved = False
        for trial in self.trials:
            step = trial.held_at
            if step is None or trial.done or trial.pausing:
                continue  # a pausing trial's run ends first (then it is PAUSED)
            pruned = pruner.decided(trial.index, step)
            if pruned is None:
                continue
            trial.held_at, moved = None, True
            run = trial.run
            if run is not None and not pruned:
                run.coordinator.pass_gate(step)
            elif run is not None:
                self._prune(trial, run, step, pruner)
            elif pruned:
                trial.state, trial.pruned_at, trial.pruned_time = RunState.PRUNED.value, step, time.time()
                trial.ended = True
                self._tell_ended(trial)
            else:
                trial.state = QUEUED  # it goes on: run again, past the rungs it passed
                log.info("sweep %s: config %d goes on past step %d", self.name, trial.index, step)
        if moved:  # a freed slot or a queued trial: the next turn at once
            self.wake.set()

    def _pause_held(self) -> None:
        """Trials waiting at a rung give their slots up while queued trials want them, or once
        they waited ``HOLD`` s (their ranks wait at most ``GATE_WAIT``)."""
        queued = sum(t.state == QUEUED for t in self.trials)
        if self.more is not None and len(self.trials) < (self.size or 0):
            queued += 1  # a search draws the next trial when a slot frees
        now = time.monotonic()
        for trial in self._running():
            if trial.held_at is None or trial.pausing or trial.pruned_at is not None:
                continue
            wanted = queued > 0 and self._busy() >= self.parallel  # a queued trial waits for its slot
            if not wanted and now - trial.held_since < HOLD:
                continue
            assert trial.run is not None
            trial.pausing = True
            queued -= 1
            trial.run.stop(
                f"paused at its rung (step {trial.held_at}) until every trial of the sweep reaches "
                "it; it runs again if it goes on (orch.SHA)"
            )

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

    def _prune(self, trial: Trial, run: Run, step: int, pruner: Pruner) -> None:
        metric = pruner.metric or "loss"
        value = trial.reported.get(step, math.nan)
        trial.pruned_at, trial.pruned_time = step, time.time()
        log.info(
            "sweep %s: config %d pruned at step %d (%s %.4g)", self.name, trial.index, step, metric, value
        )
        run.stop(f"pruned by the sweep at step {step}: {metric} {value:.4g}", prune=True)
        self.wake.set()

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
