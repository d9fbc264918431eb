"""The run this process is a rank of, for code that holds no ``ctx``.

``orch.log(step, loss=...)`` works at module level in any rank (a torchrun script, a
library's callback) and does nothing outside a run, so code that calls it runs unchanged
under ``torchrun`` or ``python``. The integrations (:mod:`orch.integrations`) and the
``SummaryWriter`` hook (:mod:`orch.runtime._scalars`) record through :func:`record`, which
never raises into the library that called it.

Importing this module imports neither torch nor anything of the worker: it is what
``import orch`` reaches for ``orch.log``.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from orch.errors import StopTraining
from orch.runtime._world import check

if TYPE_CHECKING:
    from orch.runtime.context import Context

_log = logging.getLogger(__name__)

# Set in each rank (and so in every process its code starts): "<run id>:<rank>".
RANK_ENV = "ORCH_RANK_OF"

_context: Context | None = None
_refused: set[str] = set()  # names whose points record() dropped once (said once each)


def set_context(ctx: Context | None) -> None:
    global _context
    _context = ctx


def context() -> Context | None:
    """This rank's ``ctx``, or None outside a rank of an orch run."""
    return _context


def log(step: int, loss: float | None = None, **scalars: Any) -> None:
    """``ctx.log`` for code without a ``ctx``: record ``loss`` and any scalars at ``step`` in
    this rank's series (the panel, ``run.history()``). Outside a run it does nothing.

    As ``ctx.log``: an integer step, real numbers; a bad value raises ``TypeError`` naming its
    key; in a run asked to stop, the call at the step every rank stops at raises
    :class:`orch.errors.StopTraining` after recording it.
    """
    ctx = _context
    if ctx is not None:
        ctx.log(step, loss, **scalars)


def record(step: int | None, scalars: dict[str, Any]) -> None:
    """Record ``scalars`` for a library (a logger, a callback, SummaryWriter): never raises.
    ``step`` None is the rank's last step. A value or name orch cannot take is left out, with
    one line in the rank's log per name."""
    ctx = _context
    if ctx is None:
        return
    if step is None:
        step = max(ctx.logged_step, 0)
    try:
        ctx.log(int(step), **scalars)
    except StopTraining:
        pass  # the stop reaches the library through stop_due(), at a step boundary of its own
    except (TypeError, ValueError, OverflowError):
        for name, value in scalars.items():  # one at a time: a bad one costs only itself
            try:
                ctx.log(int(step), **{name: value})
            except StopTraining:
                pass
            except (TypeError, ValueError, OverflowError) as e:
                if name not in _refused:
                    _refused.add(name)
                    _log.warning("orch left out metric %r: %s", name[:80], e)


def stop_due(step: int) -> bool:
    """True when the run was asked to stop and ``step`` is the last one every rank takes:
    a library stops there (HF ``control.should_training_stop``, Lightning's
    ``trainer.should_stop``), so every rank leaves its loop after the same step."""
    ctx = _context
    return ctx is not None and ctx.stop_due(step)


def watch_ddp(model: Any) -> None:
    """A library's DistributedDataParallel model: its gradient collectives are timed."""
    ctx = _context
    if ctx is not None:
        ctx.watch_ddp(model)


def loop_ended() -> None:
    """The library's training loop ended on this rank (every rank calls it there)."""
    ctx = _context
    if ctx is not None:
        ctx.settle_stop_vote()


def set_total_steps(n: int) -> None:
    """The run's length in steps, for its progress bar, where the library knows it."""
    ctx = _context
    if ctx is not None and isinstance(n, int) and n >= 0:
        ctx.total_steps = n


def progress(done: int) -> None:
    """The steps this rank has done, where the library counts them (its progress and pace)."""
    ctx = _context
    if ctx is not None:
        ctx.progress_to(done)


def check_world(library: str, processes: int) -> None:
    """Warn (once) when ``library`` counts ``processes`` where the run has another world size."""
    ctx = _context
    if ctx is not None:
        check(ctx, library, processes)


def rank_of() -> str | None:
    """``"<run id>:<rank>"`` when this process is a rank of an orch run or was started by
    one (the rank's environment is inherited), else None."""
    return os.environ.get(RANK_ENV) or None
