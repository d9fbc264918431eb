"""The thread that runs a sweep's configs: :class:`Scheduler`.

It takes turns until every trial ended: it folds the states of the runs that go into their
trials, closes the runs that ended (recording a failed one with its root cause) and starts
the next queued configs on the warm forkserver, ``parallel`` at a time. Once
``max_failures`` runs failed, or the sweep is stopped or closed, it starts no more: the
queued trials are CANCELLED. :class:`~orch.experiments.sweep.Sweep` is its face; stopping
and closing go through here, under the lock the thread takes its turns under.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from orch.errors import ConfigError
from orch.experiments.trial import CANCELLED, QUEUED, Trial
from orch.launchers.run import Run
from orch.launchers.spec import LaunchSpec
from orch.wire.states import RunState

log = logging.getLogger("orch.experiments.sweep")  # the sweep's messages, under the one name


class Scheduler:
    """Starts the trials of sweep ``name`` (``specs[i]`` launches ``trials[i]``) from a thread."""

    def __init__(
        self, name: str, trials: list[Trial], specs: list[LaunchSpec], parallel: int, max_failures: int | None
    ) -> None:
        self.name = name
        self.trials = trials
        self.specs = specs
        self.parallel = parallel
        self.max_failures = max_failures
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
                    if not self.stopping.is_set():
                        self._start_next()
                    if all(t.done for t in self.trials):
                        break
                self.wake.wait(0.1)
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
        for trial in self.trials:
            if len(self._running()) >= self.parallel:
                return
            if trial.state != QUEUED:
                continue
            spec = self.specs[trial.index]
            run = Run(spec)
            trial.run, trial.run_dir, trial.state, trial.started = (
                run,
                run.run_dir,
                RunState.PENDING.value,
                time.time(),
            )
            try:
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
                self._ended(trial)
            else:
                trial.state = run.coordinator.state.value

    def _ended(self, trial: Trial, error: str = "") -> None:
        run = trial.run
        assert run is not None
        with contextlib.suppress(Exception):
            run.close()  # the master's port and its server threads go; the record stays on disk
        coord = run.coordinator
        trial.state, trial.ended = coord.state.value, True
        trial.duration = time.time() - trial.started
        trial.pool_start = run.group.pool_start_seconds  # a cold pool's start, within duration
        if coord.state is RunState.FAILED:
            cause = coord.root_cause
            trial.failure = error or coord.failure
            trial.error = cause.error if cause else ""
            log.warning(
                "sweep %s: config %d %s failed: %s", self.name, trial.index, trial.config, trial.failure
            )

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
                targets = self._running()
            else:
                targets = [self.find(which)]
            for trial in targets:
                if trial.state == QUEUED:
                    trial.state, trial.failure, trial.ended = CANCELLED, reason, True
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
        self.wake.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(60.0)
        self.finished.set()
