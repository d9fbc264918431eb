"""The HF Trainer's logs, progress and stop in orch: ``Trainer(..., callbacks=[OrchCallback()])``.

Every rank records what the Trainer logs (``loss``, ``learning_rate``, ``grad_norm``, eval
metrics) at its global step; the rank's progress is the Trainer's global step and its total
``max_steps``. A stop pressed in the panel ends training at the step every rank agreed on,
through ``control.should_training_stop``, so the Trainer saves and returns as it would at its
end. The Trainer's world size (``args.world_size``) is held against the run's.
"""

from __future__ import annotations

import numbers
from typing import Any

from transformers import TrainerCallback

from orch.runtime import current

# What the Trainer logs once at the end of train(): a summary, not a series.
SUMMARY = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss"}


class OrchCallback(TrainerCallback):
    """Ships the Trainer's metrics to the panel; does nothing outside an orch run."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        current.set_total_steps(int(state.max_steps or 0))
        current.check_world("the HF Trainer", int(args.world_size))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        current.progress(int(state.global_step))
        if current.stop_due(int(state.global_step) - 1):
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        current.loop_ended()

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        scalars = {
            k: v
            for k, v in (logs or {}).items()
            if isinstance(v, numbers.Real) and not isinstance(v, bool) and k not in SUMMARY
        }
        if scalars:
            # orch's steps count from 0 (the point of step k is after k + 1 steps); the Trainer's
            # global step is the number of steps done.
            current.record(max(0, int(state.global_step) - 1), scalars)
