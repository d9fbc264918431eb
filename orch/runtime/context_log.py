"""``ctx.log`` and what it checks, counts and tells: the part of
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
from typing import TYPE_CHECKING, Any, NoReturn

from torch import nn

from orch.runtime._sender import HeartbeatSender
from orch.runtime._timing import BY_LOG, CollectiveWait, StepTimes, clock
from orch.runtime.scalars_in import as_reals, as_step
from orch.wire.limits import MAX_METRICS_PER_RANK, MAX_NAME_LEN

log = logging.getLogger(__name__)
GATE_WAIT = 10.0  # seconds a loop waits at a sweep's rung for the sweep's decision
MAX_STEP = 2**63 - 1
LOG_EVERY = 16  # steps one after another ctx.log counts before handing them to the rank's timing
HANDOVER_S = 0.1  # ... or seconds: slow steps reach the timing as they end, not 16 steps later
USER_METRICS = MAX_METRICS_PER_RANK - 2  # the names ctx.log takes: orch's own two fill the cap


class Logging:
    """What a rank reports (a part of :class:`~orch.runtime.context.Context`)."""

    stopped: bool
    times: StepTimes | None
    _sender: HeartbeatSender | None
    _names: set[str]
    _watched: str | None
    _watched_value: float | None
    _logged_step: int
    _logged_at: float
    _log_steps: int
    _log_fast: bool
    _log_timed: bool
    _warned: str
    _uses_steps: bool
    _heard: bool
    _stop_at: int
    _ddp_models: list[nn.Module]
    _waits: CollectiveWait

    if TYPE_CHECKING:  # the context's own (declared here for the type checker only)

        def _step_done(self, times: StepTimes, seconds: float, own: float = 0.0, count: int = 1) -> None: ...

        def _stop_here(self, where: str) -> NoReturn: ...

    def log(self, step: int, loss: float | None = None, **scalars: Any) -> None:
        """Record ``loss`` and any other scalars at ``step``; returns at once.

        ``step`` is an integer >= 0 (a counter of optimizer steps: with a DataLoader,
        ``epoch * len(loader) + i``). Values are real numbers: ``float``, ``int``, ``bool``,
        numpy scalars and one-element tensors (``.item()`` is taken: on a GPU that waits
        for the value). ``None`` logs nothing for that key. Anything else raises
        ``TypeError`` here, naming the key, so one bad value never costs the other points.
        A name is 1 to 256 characters, and a rank logs at most 2,046 different names (with
        orch's own ``rank/memory`` and ``rank/cuda_memory``, the 2,048 the master keeps per
        rank): past either cap this call raises ``ValueError`` naming the cap and the name,
        and logs nothing.

        In a loop without ``ctx.steps``, once the run is asked to stop, the call that logs
        the step every rank agreed to stop at raises :class:`orch.errors.StopTraining` after
        recording it: the function ends there, on every rank, and the rank is STOPPED.
        """
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
        if self._watched is not None and self._watched in scalars:
            self._watched_value = float(scalars[self._watched])
        if step != self._logged_step and self._log_timed:
            if step == self._logged_step + 1 and self._log_fast:  # the usual next step: no call, no lock
                self._logged_step = step
                self._log_steps += 1
                if self._log_steps >= LOG_EVERY or clock() - self._logged_at >= HANDOVER_S:
                    self._log_step(step)
            else:
                self._log_step(step)
        sender = self._sender
        if sender is not None:
            sender.log(step, scalars)
            if not self._uses_steps:
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
        if self._stop_at and step + 1 >= self._stop_at and not self._uses_steps:
            self.stopped = True
            self._stop_here(f"every rank stops after step {step}")

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
            self._step_done(times, now - self._logged_at, count=count)
        elif self._ddp_models:
            self._waits.skip()  # the iterations before this step are not of a timed one
        self._logged_step, self._logged_at = step, now
        # The next steps one after another are counted without a call while nothing but ctx.log
        # marks them and no collective is to be read after each.
        self._log_fast = times.timed_by == BY_LOG and not self._ddp_models

    def _stop_log_count(self, times: StepTimes) -> None:
        """ctx.steps or ctx.data marks the steps from now on: hand over the steps ctx.log
        counted, and count no more there."""
        if self._log_steps and times.timed_by == BY_LOG:
            self._log_step(self._logged_step)
        self._log_timed = self._log_fast = False

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
            if self._sender is not None:
                self._sender.note = text

    def progress_to(self, done: int) -> None:
        """This rank has done ``done`` steps (a library's own loop: the HF Trainer's global step)."""
        if self._sender is not None and done > self._sender.step:
            self._sender.step = done

    @property
    def total_steps(self) -> int:
        """The run's length in steps, for its progress bar (0: unknown)."""
        return self._sender.total_steps if self._sender is not None else 0

    @total_steps.setter
    def total_steps(self, n: int) -> None:
        """Say how many steps the run takes when the loop is not ``ctx.steps(n)``."""
        if type(n) is not int or n < 0:
            raise TypeError(f"ctx.total_steps must be an integer >= 0, got {n!r}")
        if self._sender is not None:
            self._sender.total_steps = n

    @property
    def logged_step(self) -> int:
        """The furthest step this rank reached or logged (-1: none yet)."""
        return self._sender.progress - 1 if self._sender is not None else self._logged_step
