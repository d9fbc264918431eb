"""A sweep's trials at the pruner's rungs: :class:`Rungs`, the part the sweep's
:class:`~orch.experiments.scheduler.Scheduler` owns to judge them.

Each turn, a running trial's metric (the mean over its ranks, at the steps the pruner asks
for) goes to the pruner; a trial it prunes is stopped through its master, so every rank ends
at the same step, and the run ends PRUNED.

A synchronous pruner (``orch.SHA``) decides a rung only once every trial still in the sweep
reached it. A trial there waits at the rung, holding its slot, while no queued trial wants the
slot and for at most ``HOLD`` seconds (its ranks wait ``GATE_WAIT`` at most); otherwise it is
paused: its run stops at the rung (STOPPED, its checkpoints kept), the trial reads PAUSED, and
if the rung's decision keeps it, it is queued again and runs from its newest checkpoint (from
step 0 without one), past the rungs it passed.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from collections.abc import Callable

from orch.experiments.pruning import Pruner
from orch.experiments.trial import QUEUED, Trial
from orch.launchers.run import Run
from orch.wire.states import RunState

log = logging.getLogger("orch.experiments.sweep")  # the sweep's messages, under the one name

HOLD = 6.0  # seconds a trial waits at a rung, holding its slot, for a synchronous decision


class Rungs:
    """The pruner's side of a sweep's scheduler (owned by its
    :class:`~orch.experiments.scheduler.Scheduler`): feeds the pruner the running trials'
    metric, stops the trials it prunes, and holds or pauses the trials at a synchronous pruner's
    rungs. It is called under the scheduler's lock, from its turns."""

    def __init__(
        self,
        name: str,
        trials: list[Trial],
        pruner: Pruner,
        *,
        size: int | None,
        draws: bool,
        running: Callable[[], list[Trial]],
        full: Callable[[], bool],
        tell_ended: Callable[[Trial], None],
        wake: threading.Event,
    ) -> None:
        """``trials``: the sweep's (the scheduler's list, which a search adds to); ``size``: the
        trials the sweep will have; ``draws``: a search draws them as slots free. ``running``:
        the trials whose runs go on; ``full``: every slot is in use; ``tell_ended``: tell that
        a trial ended (pruned while it waited without a run); ``wake``: the scheduler's next
        turn comes at once."""
        self.name = name
        self.trials = trials
        self.pruner = pruner
        self.size = size
        self.draws = draws
        self._running = running
        self._full = full
        self._tell_ended = tell_ended
        self._wake = wake

    def judge(self, trial: Trial, run: Run) -> None:
        """Feed the pruner the trial's metric at the steps it asks for (the mean over ranks of
        each rank's value there, or its last one before); stop the trial where it says so."""
        pruner = self.pruner
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
            if verdict is None:  # a synchronous pruner: the trial waits at the rung (see settle)
                trial.held_at, trial.held_since = step, time.monotonic()
                self._wake.set()
                return
            if not verdict:
                run.coordinator.pass_gate(step)
            else:
                self._prune(trial, run, step)
                return

    def settle(self) -> None:
        """A synchronous pruner decides the rungs every trial still in the sweep reached; the
        trials waiting at a decided rung go on (past the gate, or queued again) or end PRUNED."""
        pruner = self.pruner
        alive = {t.index for t in self.trials if not t.done and t.pruned_at is None}
        size = max(self.size or 0, len(self.trials)) if self.draws else len(self.trials)
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
                self._prune(trial, run, step)
            elif pruned:
                trial.state, trial.pruned_at, trial.pruned_time = RunState.PRUNED.value, step, time.time()
                trial.ended = True
                self._tell_ended(trial)
            else:
                trial.state = QUEUED  # it goes on: run again, past the rungs it passed
                log.info("sweep %s: config %d goes on past step %d", self.name, trial.index, step)
        if moved:  # a freed slot or a queued trial: the next turn at once
            self._wake.set()

    def pause_held(self) -> None:
        """Trials waiting at a rung give their slots up while queued trials want them, or once
        they waited ``HOLD`` s (their ranks wait at most ``GATE_WAIT``)."""
        queued = sum(t.state == QUEUED for t in self.trials)
        if self.draws and len(self.trials) < (self.size or 0):
            queued += 1  # a search draws the next trial when a slot frees
        now = time.monotonic()
        for trial in self._running():
            if trial.held_at is None or trial.pausing or trial.pruned_at is not None:
                continue
            wanted = queued > 0 and self._full()  # a queued trial waits for its slot
            if not wanted and now - trial.held_since < HOLD:
                continue
            assert trial.run is not None
            trial.pausing = True
            queued -= 1
            trial.run.stop(
                f"paused at its rung (step {trial.held_at}) until every trial of the sweep reaches "
                "it; it runs again if it goes on (orch.SHA)"
            )

    def _prune(self, trial: Trial, run: Run, step: int) -> None:
        metric = self.pruner.metric or "loss"
        value = trial.reported.get(step, math.nan)
        trial.pruned_at, trial.pruned_time = step, time.time()
        log.info(
            "sweep %s: config %d pruned at step %d (%s %.4g)", self.name, trial.index, step, metric, value
        )
        run.stop(f"pruned by the sweep at step {step}: {metric} {value:.4g}", prune=True)
        self._wake.set()
