"""``ctx.log`` and what it checks, counts and tells: :class:`RankLog`, the part of
:class:`~orch.runtime.context.Context` a training loop calls every step to report.

A value is a real number (see :mod:`orch.runtime.scalars_in`), a name is within the master's
caps (:mod:`orch.wire.limits`), checked at the call so that a point the master would refuse
is refused here, naming it. In a loop that neither ``ctx.steps`` nor ``ctx.data`` marks, the
logged steps are the ones timed (:mod:`orch.runtime._timing`); the common call, the next
step's plain floats, costs a few attribute updates. A warning, a library's own step count
and the run's length reach the master through the rank's heartbeat sender.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn

from torch import nn

from orch.runtime._sender import HeartbeatSender
from orch.runtime._stop_vote import StopRequest
from orch.runtime._timing import BY_LOG, CollectiveWait, StepTimes, clock
from orch.runtime.scalars_in import as_reals, as_step
from orch.wire.limits import MAX_METRICS_PER_RANK, MAX_NAME_LEN

log = logging.getLogger(__name__)
GATE_WAIT = 10.0  # seconds a loop waits at a sweep's rung for the sweep's decision
MAX_STEP = 2**63 - 1
LOG_EVERY = 16  # steps one after another ctx.log counts before handing them to the rank's timing
HANDOVER_S = 0.1  # ... or seconds: slow steps reach the timing as they end, not 16 steps later
USER_METRICS = MAX_METRICS_PER_RANK - 2  # the names ctx.log takes: orch's own two fill the cap


class RankLog:
    """What a rank reports (a part of :class:`~orch.runtime.context.Context`): ``ctx.log``,
    ``ctx.warn``, the rank's progress and the run's length."""

    def __init__(
        self,
        *,
        sender: HeartbeatSender | None,
        times: StepTimes | None,
        stop: StopRequest,
        ddp_models: list[nn.Module],
        waits: CollectiveWait,
        step_done: Callable[[StepTimes, float, float, int], None],
        end: Callable[[str], NoReturn],
    ) -> None:
        """``sender``: the rank's heartbeat sender (None outside a worker); ``times``: the rank's
        step timing (None: off); ``stop``: the run's stop request; ``ddp_models`` and ``waits``:
        the DDP models whose collective waits are read after each timed step, and their reader
        (the context's, which adds to the list); ``step_done(times, seconds, own, count)``:
        ``count`` steps ended (the context times them); ``end(where)``: end the function at a
        stop's step, every rank alike (the context's: it raises)."""
        self.sender = sender
        self.times = times
        self.uses_steps = False  # ctx.steps() drives the loop: it handles stops and rungs itself
        self.watched: str | None = None  # ctx.steps(metric=...): the metric its checkpoints carry
        self.watched_value: float | None = None  # this rank's last logged value of it
        self.timed = times is not None  # ctx.log marks the steps: nothing stronger did yet
        self.fast = False  # ctx.log may count the next step itself (see _log_step)
        self._stop = stop
        self._ddp_models = ddp_models
        self._waits = waits
        self._step_done = step_done
        self._end = end
        self._names: set[str] = set()  # the metric names ctx.log took (see MAX_METRICS_PER_RANK)
        self._heard = False  # ctx.log asked the master once (a sweep's first rung) before a step
        self._logged_step, self._logged_at = -1, 0.0  # ctx.log's last new step, and when (BY_LOG)
        self._log_steps = 0  # steps ctx.log counted since _logged_at, not handed to self.times yet
        self._warned = ""  # the last warning told (see warn)

    def watch(self, metric: str | None) -> None:
        """``ctx.steps(metric=...)``: keep this rank's last logged value of ``metric``."""
        if metric != self.watched:
            self.watched, self.watched_value = metric, None

    def log(self, step: int, loss: float | None, scalars: dict[str, Any]) -> None:
        """:meth:`Context.log <orch.runtime.context.Context.log>`: check the point, count and
        time the step, hand the point to the sender; end the function at a stop's step.
        ``scalars``: the call's own keyword arguments (taken as they are, not copied)."""
        if type(step) is not int:
            step = as_step(step)
        if step < 0 or step > MAX_STEP:
            raise ValueError(f"ctx.log: step must be between 0 and {MAX_STEP}, got {step}")
        if loss is not None:
            scalars["loss"] = loss
        # The common case, plain floats, costs one type check per value.
        for value in scalars.values():
            if type(value) is not float:
                scalars = as_reals(scalars)
                break
        if not scalars.keys() <= self._names:
            self._take_names(scalars)
        if self.watched is not None and self.watched in scalars:
            self.watched_value = float(scalars[self.watched])
        if step != self._logged_step and self.timed:
            if step == self._logged_step + 1 and self.fast:  # the usual next step: no call, no lock
                self._logged_step = step
                self._log_steps += 1
                if self._log_steps >= LOG_EVERY or clock() - self._logged_at >= HANDOVER_S:
                    self._log_step(step)
            else:
                self._log_step(step)
        sender = self.sender
        if sender is not None:
            sender.log(step, scalars)
            if not self.uses_steps:
                if not self._heard:  # a sweep's first rung, known before the loop gets there
                    self._heard = True
                    sender.hear()
                if 0 < sender.last_hold == step:
                    # A sweep's rung, logged by a loop without ctx.steps (ctx.data, ctx.log
                    # alone): wait there for the sweep's decision, as ctx.steps does. A pruned
                    # trial's master names the step after the rung as every rank's stop step
                    # (each knew of the rung and none is past it), so the check below ends
                    # the loop right here on every rank.
                    sender.wait_gate(step, GATE_WAIT)
        if self._stop.at and step + 1 >= self._stop.at and not self.uses_steps:
            self._end(f"every rank stops after step {step}")

    def _log_step(self, step: int) -> None:
        """A new step logged: in a loop that neither ctx.steps nor ctx.data marks, the steps
        since the last one logged are timed, from that call to this one (compute is all of it
        but the collective wait: ctx.log cannot tell data from compute). Without a model of
        ctx.ddp's to read, steps one after another are counted in :meth:`log` itself and
        handed over here every LOG_EVERY steps (or HANDOVER_S seconds): ctx.log stays a few
        attribute updates."""
        times = self.times
        if times is None:
            return
        now = clock()
        last = self._logged_step
        count = self._log_steps + (step - last if 0 <= last < step else 0)
        self._log_steps = 0
        if count and (times.timed_by == BY_LOG or times.marks(BY_LOG)):
            self._step_done(times, now - self._logged_at, 0.0, count)
        elif self._ddp_models:
            self._waits.skip()  # the iterations before this step are not of a timed one
        self._logged_step, self._logged_at = step, now
        # The next steps one after another are counted without a call while nothing but ctx.log
        # marks them and no collective is to be read after each.
        self.fast = times.timed_by == BY_LOG and not self._ddp_models

    def hand_over(self, times: StepTimes) -> None:
        """ctx.steps or ctx.data marks the steps from now on: hand over the steps ctx.log
        counted, and count no more there."""
        if self._log_steps and times.timed_by == BY_LOG:
            self._log_step(self._logged_step)
        self.timed = self.fast = False

    def _take_names(self, scalars: dict[str, Any]) -> None:
        """Check the names this rank logs for the first time against the master's caps: a
        point it would refuse is refused here, at the call, rather than dropped later."""
        new = [name for name in scalars if name not in self._names]
        for name in new:
            if not 0 < len(name) <= MAX_NAME_LEN:
                shown = name if len(name) <= 60 else f"{name[:60]}..."
                raise ValueError(
                    f"ctx.log: the metric name {shown!r} is {len(name)} characters; the cap is "
                    f"{MAX_NAME_LEN}: use a shorter name"
                )
            try:
                name.encode()
            except UnicodeEncodeError as e:  # a lone surrogate cannot travel
                raise ValueError(f"ctx.log: the metric name {name!r} is not valid text: {e}") from e
        if len(self._names) + len(new) > USER_METRICS:
            past = new[max(USER_METRICS - len(self._names), 0)]
            raise ValueError(
                f"ctx.log: {past!r} would be metric name number {USER_METRICS + 1:,} of this rank; "
                f"the cap is {USER_METRICS:,} different names per rank ({MAX_METRICS_PER_RANK:,} with "
                "orch's own rank/memory and rank/cuda_memory): log fewer names, for example one per "
                "group of layers"
            )
        self._names.update(new)

    def warn(self, text: str) -> None:
        """A warning about the run, from the rank's code (a library that sees another world
        size): in the rank's log, its row of the panel and the run's events."""
        text = " ".join(str(text).split())[:1000]
        if text and text != self._warned:
            self._warned = text
            log.warning("%s", text)
            if self.sender is not None:
                self.sender.note = text

    def progress_to(self, done: int) -> None:
        """This rank has done ``done`` steps (a library's own loop: the HF Trainer's global step)."""
        if self.sender is not None and done > self.sender.step:
            self.sender.step = done

    @property
    def total_steps(self) -> int:
        """The run's length in steps, for its progress bar (0: unknown)."""
        return self.sender.total_steps if self.sender is not None else 0

    @total_steps.setter
    def total_steps(self, n: int) -> None:
        """Say how many steps the run takes when the loop is not ``ctx.steps(n)``."""
        if type(n) is not int or n < 0:
            raise TypeError(f"ctx.total_steps must be an integer >= 0, got {n!r}")
        if self.sender is not None:
            self.sender.total_steps = n

    @property
    def logged_step(self) -> int:
        """The furthest step this rank reached or logged (-1: none yet)."""
        return self.sender.progress - 1 if self.sender is not None else self._logged_step
