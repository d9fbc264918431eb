"""A rank's step where its code counts none: the training iterations of its DDP models.

A rank's step is its ``ctx.steps`` count or one past the last step it logged, whichever is
larger (:attr:`~orch.runtime._sender.HeartbeatSender.progress`). Code that logs only on rank 0
(an Accelerate tracker, a Lightning or HF logger, a ``SummaryWriter`` on rank 0) or logs
nothing (a torchrun script) would leave the other ranks, or all of them, at step 0. There the
step is the count of training iterations of the rank's ``DistributedDataParallel`` models
(the furthest model's): their forwards in train mode, with grad enabled, outside
``no_sync()``, the ones DDP's reducer counts and syncs the gradients of (one per optimizer
step under gradient accumulation too). A rank that trained 5 iterations is at step 5, as a
loop that logged steps 0 .. 4 is.

:func:`install` wraps DistributedDataParallel's ``__init__`` once per process, so that every
DDP model made in the rank (the script's, ``ctx.ddp``'s, a library's) is counted: the model's
``_pre_forward``, which its ``forward`` calls first, is replaced for that model alone by a
function that adds one and calls it (about 0.3 µs a forward on a busy 2-core machine, against
the tens of µs of DDP's own Python in each forward). The heartbeat thread reads the counts,
plain ints. Once the rank's code counts its steps itself (``ctx.steps``, a logged step) the
wrappers come off (:meth:`Iterations.close`), so a loop that logs pays for them only until
its next beat.

Why not another signal: the iteration DDP's logger records is set as the next forward starts
(a run of 5 iterations reads 4), and every iteration only once its sampling rate is 1, a C++
statistics pass per iteration; a forward pre-hook costs about 1 µs (``nn.Module``'s slow call
path).
"""

from __future__ import annotations

import functools
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class _Counter:
    """One DDP model's training iterations, counted by a wrapper of its ``_pre_forward``."""

    __slots__ = ("_model", "_wrapper", "n")

    def __init__(self, model: nn.parallel.DistributedDataParallel) -> None:
        self.n = 0
        # Weakly: the wrapper lives in the model's __dict__, and a cycle would keep a model
        # its code let go of (and its memory) until the garbage collector runs.
        self._model = weakref.ref(model)
        self._wrapper = self._counting(type(model)._pre_forward)
        _untraced(self._wrapper.__code__)

    def _counting(self, pre_forward: Callable[..., Any]) -> Callable[..., Any]:
        model_of, grad_enabled = self._model, torch.is_grad_enabled

        def _pre_forward(*inputs: Any, **kwargs: Any) -> Any:
            model: Any = model_of()  # alive: its forward is calling this
            # DDP's reducer counts an iteration on the same condition (train mode aside).
            if model.training and model.require_backward_grad_sync and grad_enabled():
                self.n += 1
            return pre_forward(model, *inputs, **kwargs)

        return _pre_forward

    @property
    def alive(self) -> bool:
        return self._model() is not None

    def wrap(self) -> None:
        model = self._model()
        if model is not None:
            model.__dict__["_pre_forward"] = self._wrapper

    def unwrap(self) -> None:
        model = self._model()
        if model is not None and model.__dict__.get("_pre_forward") is self._wrapper:
            del model.__dict__["_pre_forward"]  # one dict operation: safe from the heartbeat thread


def _untraced(code: types.CodeType) -> None:
    """Have ``torch.compile`` run the wrapper as it is, as it does DDP's forward around it:
    traced, its count would be a constant it guards on, one recompilation per iteration."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # DDP's __init__ imported it
    skip = getattr(eval_frame, "skip_code", None)
    if skip is not None:
        skip(code)


_counters: list[_Counter] = []  # every DDP model made in this process, in order (kept as counts)
_installed = False
_counting = False  # an Iterations is open: new models are counted from their first forward


def install() -> None:
    """Count the iterations of every DistributedDataParallel model made in this process from
    now on (idempotent)."""
    global _installed
    cls = nn.parallel.DistributedDataParallel
    if _installed or not callable(getattr(cls, "_pre_forward", None)):
        return  # a torch whose DDP has no _pre_forward (before 2.0): its ranks count no iterations
    _installed = True
    init = cls.__init__
    getstate: Callable[[nn.parallel.DistributedDataParallel], dict[str, Any]] = cls.__getstate__

    @functools.wraps(init)
    def __init__(self: nn.parallel.DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        counter = _Counter(self)
        _counters.append(counter)
        if _counting:
            counter.wrap()

    @functools.wraps(getstate)
    def __getstate__(self: nn.parallel.DistributedDataParallel) -> dict[str, Any]:
        # A pickled or deep-copied model goes without the wrapper: it pickles, and a copy
        # never calls (and counts for) the model it was copied from.
        state = getstate(self)
        state.pop("_pre_forward", None)
        return state

    cls.__init__ = __init__  # type: ignore[method-assign]
    cls.__getstate__ = __getstate__  # type: ignore[method-assign]


class Iterations:
    """The training iterations of this rank's DDP models since it was made (a gang's call
    counts its own), the furthest model's: the step of a rank whose code counts none."""

    def __init__(self) -> None:
        global _counting
        install()
        _counting = True
        # The models a gang's earlier call made (and kept) are counted anew; those it let go of
        # are forgotten.
        _counters[:] = [c for c in _counters if c.alive]
        self._from = {counter: counter.n for counter in _counters}
        for counter in _counters:
            counter.wrap()

    def __call__(self) -> int:
        counters = tuple(_counters)  # the training thread may append one meanwhile
        return max((c.n - self._from.get(c, 0) for c in counters), default=0)

    def close(self) -> None:
        """Count no more: the rank's code counts its steps."""
        global _counting
        _counting = False
        for counter in tuple(_counters):
            counter.unwrap()
