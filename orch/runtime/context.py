"""What a training function receives: its rank, device, config, and the orch hooks."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from orch.errors import CallInterrupted, StopTraining
from orch.record.checkpoint_index import Mode, check_keep
from orch.runtime._ddp_steps import Iterations
from orch.runtime._sender import HeartbeatSender
from orch.runtime._stop_vote import Collectives, LibraryStop, StopRequest, StopVote, sharded
from orch.runtime._timing import (
    BY_DATA,
    BY_STEPS,
    OFF,
    RESERVED,
    CollectiveWait,
    StepTimes,
    clock,
    enabled,
)
from orch.runtime.context_checkpoints import RankCheckpoints
from orch.runtime.context_log import GATE_WAIT, RankLog

T = TypeVar("T")
log = logging.getLogger(__name__)


class Context:
    """Passed to the training function as ``ctx``.

    ``ctx.rank``, ``ctx.world_size``, ``ctx.local_rank``, ``ctx.device`` and
    ``ctx.config`` describe this rank; ``ctx.ddp(model)`` wraps a model,
    ``ctx.steps(n)`` drives the loop and ``ctx.log(step, loss=..., **scalars)``
    reports progress without blocking.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        local_rank: int,
        device: torch.device,
        config: dict[str, Any],
        run_id: str,
        sender: HeartbeatSender | None,
        control_group: Any = None,
        checkpoint_dir: Path | None = None,
        attempt: int = 1,
        state: types.SimpleNamespace | None = None,
        kept: Any = None,
    ) -> None:
        """``kept``: a gang rank's :class:`~orch.runtime.gang_session.Session`, whose models from
        earlier calls this call counts too (checksums, collective timings), and which hears of
        each model ``ddp`` wraps (a remade group rewraps them)."""
        self.rank = rank
        # What the function keeps for its next call in a gang (orch.gang): the rank's namespace,
        # which a %%orch cell's names are in too. A run's own otherwise.
        self.state = state if state is not None else types.SimpleNamespace()
        self.world_size = world_size
        self.local_rank = local_rank
        self.device = device
        self.config = config
        self.run_id = run_id
        self._sender = sender
        self._control_group = control_group
        self._stop = StopRequest()  # the run's, as this rank heard it (see request_stop)
        self._kept = kept
        self._models: list[nn.Module] = kept.live(kept.models) if kept is not None else []
        self.stopped = False  # True once ctx.steps() ended early because of a stop request
        # A gang's call: a stop raises CallInterrupted at the step boundary, where a run's loop ends
        self.interrupt_on_stop = False
        self.attempt = attempt  # 1, then one more after each restart of the group
        self.checkpoint_dir = checkpoint_dir
        self.resume_step = 0  # the first step ctx.steps() yields (after a loaded checkpoint)
        self._step = -1
        self._batches = 0  # batches ctx.data yielded and the loop was done with: its steps (see data)
        # A library's loop's stop decision (see stop_due)
        self._library_stop = LibraryStop(self._stop, control_group)
        # The code's collectives of every rank (orch's own votes aside): a loop that holds one is
        # every rank's (see data)
        self._collectives = Collectives(world_size, self._own_groups)
        # Where each step's time goes (data, collectives, sections): see orch.runtime._timing.
        self.times: StepTimes | None = StepTimes() if enabled() else None
        self._ddp_models: list[nn.Module] = kept.live(kept.timed) if kept is not None else []
        self._waits = CollectiveWait(self._ddp_models)
        # What ctx.log and its kin report (see orch.runtime.context_log)
        self._log = RankLog(
            sender=sender,
            times=self.times,
            stop=self._stop,
            ddp_models=self._ddp_models,
            waits=self._waits,
            step_done=self._step_done,
            end=self._end_stopped,
        )
        # ctx.save_checkpoint, ctx.load_checkpoint and ctx.steps' own (see orch.runtime.context_checkpoints)
        self._checkpoints = RankCheckpoints(
            rank=rank,
            attempt=attempt,
            device=device,
            folder=checkpoint_dir,
            sender=sender,
            control_group=control_group,
        )
        if sender is not None:
            # The master is told when this rank does not time its steps: never "not yet" for that.
            sender.timing = self.times.take if self.times is not None else lambda: OFF
            # A rank whose code counts no steps is at its DDP models' iteration (see Iterations).
            sender.iterations = Iterations()

    def _own_groups(self) -> tuple[Any, ...]:
        """orch's own process groups, whose collectives (the stop votes) are not the code's."""
        vote = self._library_stop.vote
        return (self._control_group, vote.group if vote is not None else None)

    @property
    def is_main(self) -> bool:
        """True on rank 0: the one rank that should print or write shared files."""
        return self.rank == 0

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def _stop_here(self, where: str) -> NoReturn:
        """End the function here, every rank at one point: StopTraining (a gang's: CallInterrupted)."""
        kind = CallInterrupted if self.interrupt_on_stop else StopTraining
        raise kind(f"the run was asked to stop; {where}")

    def _end_stopped(self, where: str) -> NoReturn:
        """A loop without ctx.steps ends here on a stop, every rank at one point: the rank is STOPPED."""
        self.stopped = True
        self._stop_here(where)

    def request_stop(self, at_step: int = 0) -> None:
        """Stop: ``ctx.steps`` ends at the next step on every rank; a loop without it ends when
        ``ctx.log`` is given step ``at_step - 1`` (the same on every rank; 0: unknown)."""
        self._stop.request(at_step)

    def ddp(self, model: nn.Module, **kwargs: Any) -> nn.Module:
        """Move ``model`` to this rank's device and wrap it in DistributedDataParallel.

        At every world size, 1 included (a process group of one), so ``model.module`` and
        the rest of the code written for several ranks run unchanged on one.
        """
        model = model.to(self.device)
        self._models.append(model)
        if not dist.is_initialized():  # only a Context made outside a worker has no group
            return model
        if self.device.type == "cuda":
            kwargs.setdefault("device_ids", [self.device.index])
        wrapped = nn.parallel.DistributedDataParallel(model, **kwargs)
        if self._kept is not None:
            self._kept.wrapped.add(wrapped, kwargs)
        if self.times is not None and CollectiveWait.watch(wrapped):
            # How long this rank waits for its peers in the gradient all-reduce (DDP's own timers);
            # the collectives count as timed once a reading came (see CollectiveWait.take).
            self._ddp_models.append(wrapped)
        return wrapped

    def watch_ddp(self, model: Any) -> None:
        """Time the gradient collectives of a DistributedDataParallel model a library made (as
        :meth:`ddp` does for its own), so the panel can tell a straggler from its peers."""
        if (
            self.times is not None
            and isinstance(model, nn.parallel.DistributedDataParallel)
            and all(m is not model for m in self._ddp_models)
            and CollectiveWait.watch(model)
        ):
            self._ddp_models.append(model)
            self._log.fast = False  # each step's wait is read: ctx.log no longer counts alone

    def data(self, batches: Iterable[T]) -> Iterator[T]:
        """Iterate ``batches`` (a DataLoader, any iterable), timing the wait for each one:
        ``for x, y in ctx.data(loader):``. The panel shows it as the step's "data" time.

        In a loop that ``ctx.steps`` does not drive, each batch is a step: the rank's step
        counts the batches its ``ctx.data`` loops yielded (across epochs), and each is timed
        from one request for a batch to the next (the wait for the batch included), so that the
        usual ``for epoch in range(n): for x, y in ctx.data(loader):`` shows its progress,
        steps/s and step times. There a stop raises StopTraining before a batch, within about a
        second of the Stop, every rank at the same batch where that matters:

        - a loop every rank goes through batch for batch, as its loader is sharded by a
          ``DistributedSampler`` (from its first batch) or its batches hold a collective of
          every rank (DDP's gradient all-reduce, FSDP's, the code's own; from the batch after
          the first one): the ranks vote on the stop (see :class:`StopVote`), a batch or two
          after the first rank heard of it. A loader only one rank iterates (an evaluation on
          rank 0) holds no such collective, or it would wait for itself: it never votes, so it
          never waits for peers that are not there;
        - a loop of code that ran no collective of every rank since the function started: each
          rank stops at its next batch once it heard of the stop (no peer waits for it);
        - any other loop (a collective-free loop of code that runs them elsewhere, or where
          torch keeps no count of them): at the master's stop step, the same batch count on
          every rank (about 2 s of steps ahead), where ``ctx.log`` ends a loop."""
        times = self.times
        it = iter(batches)
        group = self._control_group
        vote = StopVote(group) if group is not None and sharded(batches) else None
        # Until it votes: the collectives before its first batch (the loop's first one arms a vote).
        before = self._collectives.count() if vote is None and group is not None else None
        started = 0.0  # when the batch before was asked for: its step's start (BY_DATA)
        index = 0  # the batch asked for, in this loop
        try:
            while True:
                start = clock()
                if times is not None and self._log.timed:
                    self._log.hand_over(times)
                if times is not None and times.marks(BY_DATA) and started:
                    self._step_done(times, start - started)
                if not self._log.uses_steps:
                    if index:
                        self._batches += 1  # the batch before was done with: a step
                    vote = self._data_step(vote, before, index)
                started = start
                index += 1
                try:
                    batch = next(it)
                except StopIteration:
                    return
                if times is not None:
                    times.data(clock() - start)
                yield batch
        finally:
            if vote is not None:
                vote.settle()

    def _data_step(self, vote: StopVote | None, before: int | None, index: int) -> StopVote | None:
        """Before batch ``index`` of a ctx.data loop that ctx.steps does not drive: the steps
        done, and the stop if the run is to stop (see :meth:`data`). Returns the loop's vote,
        made once its batches held a collective of every rank (looked for before each of its
        first 16 batches, then every 16th: a loop that holds none pays little)."""
        sender = self._sender
        if sender is not None:
            sender.step = self._batches
            sender.counts_steps = True  # its DDP models' iterations are no longer its step
        if vote is None and before is not None and index > 0 and (index <= 16 or index % 16 == 0):
            now = self._collectives.count()
            if now is not None and now != before:
                # Every rank alike: the same code runs its collectives at the same batches, so
                # every rank casts its first vote before the same batch.
                vote = StopVote(self._control_group)
        if vote is not None:
            if vote.cast(self._stop.is_set()):
                self._end_stopped("every rank stops before this batch")
        elif self._stop.is_set() and self._data_stop_due(first=index == 0):
            self._end_stopped("every rank stops before this batch")
        return vote

    def _data_stop_due(self, first: bool) -> bool:
        """A stop heard, in a ctx.data loop that does not vote: stop here? Alone, at once. With
        peers, from the loop's second batch (before its first, whether its batches hold a
        collective is not known yet): at once when the code ran none, else at the master's stop
        step."""
        if self.world_size == 1:
            return True
        if first:
            return False
        return bool(self._stop.at and self._batches >= self._stop.at) or self._collectives.none_yet()

    def _step_done(self, times: StepTimes, seconds: float, own: float = 0.0, count: int = 1) -> None:
        """``count`` steps ended, ``seconds`` long in all (``own`` of it orch's): with the wait
        for the peers in the gradient collectives, when DDP's timers are read (see
        :meth:`CollectiveWait.after`)."""
        waited = self._waits.after(count, seconds) if self._ddp_models else None
        if waited is not None:
            times.collectives = True
            times.collective(waited)
        times.step(seconds, own, count)

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Time a part of the step: ``with ctx.section("augment"): ...``. A straggler slow in
        it is named by it."""
        if not isinstance(name, str) or not 0 < len(name) <= 64 or not name.isprintable():
            raise ValueError(f"ctx.section(name) needs a printable name of 1 to 64 characters, got {name!r}")
        if name in RESERVED:
            raise ValueError(f"ctx.section({name!r}): that name is a part of every step; choose another")
        name.encode()  # a lone surrogate cannot travel: UnicodeEncodeError here, not in the heartbeat
        start = clock()
        try:
            yield
        finally:
            if self.times is not None:
                self.times.section(name, clock() - start)

    def steps(
        self,
        n: int,
        *,
        checkpoint: Callable[[], Any] | None = None,
        every: int = 0,
        keep: int = 2,
        metric: str | None = None,
        mode: Mode = "min",
    ) -> Iterator[int]:
        """Yield the step numbers ``resume_step .. n-1``; end early, on every rank at once, on a stop.

        ``resume_step`` is 0, or the step after the checkpoint :meth:`load_checkpoint`
        loaded. With ``checkpoint`` (a function returning the state to save) the state is
        saved every ``every`` steps and when a stop ends the loop. The stop decision is
        shared with an asynchronous all-reduce launched one step ahead, so every rank
        leaves the loop at the same step without a blocking collective in each step.

        ``metric`` names a metric the loop logs (``ctx.log(step, val_loss=...)``): each
        checkpoint then carries its value, the mean over ranks of each rank's last logged
        value, and ``keep`` checkpoints are kept, the best by it (the least with ``mode="min"``,
        the greatest with ``"max"``), plus the newest. Without ``metric``, the ``keep`` newest.
        """
        if n < 0:
            raise ValueError(f"ctx.steps(n) needs n >= 0, got {n}")
        if every < 0 or (every and checkpoint is None):
            raise ValueError("ctx.steps(every=k) needs k >= 0 and a checkpoint function")
        check_keep(keep, mode, "ctx.steps")
        if metric is not None and (not isinstance(metric, str) or not metric or checkpoint is None):
            raise ValueError(
                f"ctx.steps(metric=...) names a metric this loop logs, for its checkpoints: a non-empty "
                f"name, with checkpoint=; got metric={metric!r}"
            )
        self._log.watch(metric)
        self._log.uses_steps = True
        if self.times is not None:
            self._log.hand_over(self.times)
            self.times.marks(BY_STEPS)
        if self._sender is not None:
            self._sender.total_steps = n
            self._sender.counts_steps = True
        vote = StopVote(self._control_group) if self._control_group is not None else None
        sender = self._sender
        if sender is not None:
            sender.hear()  # a sweep's first rung, before the first step: it may come within a beat
        times = self.times
        started = resumed = 0.0  # the current step's start; when the user's body handed back
        try:
            for step in range(self.resume_step, n):
                heard = self._stop.is_set()
                if vote is not None:
                    # Votes spaced out only once the master was heard: a sweep's rung comes with its
                    # first reply, and a rank that knows one votes every step until it holds there.
                    rung = sender.last_hold if sender is not None else 0
                    stop = vote.cast(heard, rung, space=sender is None or sender.answered)
                else:
                    stop = heard
                if stop:
                    self.stopped = True
                    if self._sender is not None:
                        self._sender.step = self._step + 1  # steps done: the last one finished
                    if checkpoint is not None and self._step >= 0:
                        self._checkpoint_together(checkpoint(), keep=keep, mode=mode)
                    if self.interrupt_on_stop:
                        self._stop_here(f"every rank stops before step {step}")
                    return
                self._step = step
                if self._sender is not None:
                    self._sender.step = step
                if times is not None:
                    now = clock()
                    if started:  # the step before: body, then orch's own work until now
                        self._step_done(times, now - started, now - resumed)
                    started = now
                yield step
                if times is not None:
                    resumed = clock()
                if every and (step + 1) % every == 0:
                    self._checkpoint_together(checkpoint(), keep=keep, mode=mode)  # type: ignore[misc]
                rung = vote.hold if vote is not None else sender.last_hold if sender is not None else 0
                if sender is not None and 0 < rung == step:
                    # A sweep's rung, the same on every rank (the vote carried it): each waits
                    # here for the sweep's decision, then all take the one answer, so a pruned
                    # trial ends at its rung on every rank, never one rank a step ahead.
                    sender.wait_gate(step, GATE_WAIT)
                    told = self._stop.is_set()
                    if vote is not None:
                        told = vote.agree(told)
                    if told:
                        self.stopped = True
                        sender.step = step + 1
                        if checkpoint is not None:
                            self._checkpoint_together(checkpoint(), keep=keep, mode=mode)
                        return
            if self._sender is not None:
                self._sender.step = n
        finally:
            if vote is not None:
                vote.settle()

    def param_checksum(self) -> str:
        """sha256 of every parameter of the models passed to :meth:`ddp`, in order."""
        h = hashlib.sha256()
        for model in self._models:
            for p in model.parameters():
                h.update(p.detach().to("cpu", torch.float64).contiguous().numpy().tobytes())
        return h.hexdigest() if self._models else ""

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
        self._log.log(step, loss, scalars)

    def warn(self, text: str) -> None:
        """A warning about the run, from the rank's code (a library that sees another world
        size): in the rank's log, its row of the panel and the run's events."""
        self._log.warn(text)

    def progress_to(self, done: int) -> None:
        """This rank has done ``done`` steps (a library's own loop: the HF Trainer's global step)."""
        self._log.progress_to(done)

    @property
    def total_steps(self) -> int:
        """The run's length in steps, for its progress bar (0: unknown)."""
        return self._log.total_steps

    @total_steps.setter
    def total_steps(self, n: int) -> None:
        """Say how many steps the run takes when the loop is not ``ctx.steps(n)``."""
        self._log.total_steps = n

    @property
    def logged_step(self) -> int:
        """The furthest step this rank reached or logged (-1: none yet)."""
        return self._log.logged_step

    def _checkpoint_together(self, state: Any, *, keep: int, mode: Mode) -> Path | None:
        """A checkpoint of ``ctx.steps`` at the current step, every rank at once (see
        :meth:`RankCheckpoints.together`), carrying the watched metric's mean over ranks."""
        watched, mine = self._log.watched, self._log.watched_value
        return self._checkpoints.together(
            state, step=self._step, metric=watched, mine=mine, keep=keep, mode=mode
        )

    def save_checkpoint(
        self,
        state: Any,
        *,
        step: int | None = None,
        value: float | None = None,
        metric: str = "",
        keep: int = 2,
        mode: Mode = "min",
    ) -> Path | None:
        """Save ``state`` (anything ``torch.save`` takes) as of ``step`` (default: the current one).

        Rank 0 writes it, atomically, to the run dir's ``checkpoints/``; the other ranks
        hold the same DDP state and write nothing. Every rank first hands the master all the
        points it logged so far, so that a restart from this checkpoint finds the history
        up to it complete. Returns the file on rank 0.

        ``value`` (rank 0's; pass the same on every rank, such as an all-reduced validation
        loss) is the metric this checkpoint is ranked by, ``metric`` its name. After the write
        the ``keep`` best by value are kept (the least with ``mode="min"``, the greatest with
        ``"max"``; a checkpoint without a value, or with NaN, ranks after those with one),
        plus the newest: without values, the ``keep`` newest. ``run.best_checkpoint`` names the best.
        """
        step = self._step if step is None else step
        return self._checkpoints.save(state, step=step, value=value, metric=metric, keep=keep, mode=mode)

    def load_checkpoint(self, *, weights_only: bool = True) -> Any:
        """The state of the newest checkpoint, or None; ``ctx.steps()`` then resumes after it.

        The file is loaded with ``torch.load(weights_only=True)``: tensors, numbers, strings
        and the lists, tuples and dicts of them (model and optimizer state dicts) load, and
        nothing in the file can run code. A state that holds other objects needs
        ``ctx.load_checkpoint(weights_only=False)``: only for checkpoint dirs nobody else can
        write, since unpickling such a file runs whatever it names. ``checkpoints/latest``
        must name a file :meth:`save_checkpoint` writes (``step-<9+ digits>.pt``), in that dir.

        A newest checkpoint that is damaged (truncated, or not a whole archive) is skipped for
        the newest one that loads; the rank's log names both (see :mod:`orch.runtime.checkpoints`).
        """
        loaded = self._checkpoints.load(weights_only=weights_only)
        if loaded is None:
            return None
        step, state = loaded
        self.resume_step, self._step = step + 1, step
        return state

    def stop_due(self, step: int) -> bool:
        """True when the run was asked to stop and every rank leaves its loop after this
        step: for a library's loop (``ctx.steps`` has its own). Every rank calls it once a step,
        from the library's step-end hook: with several ranks the decision is a vote of all of
        them (see :class:`StopVote`), so each learns of the stop at the same step however late
        its own heartbeat brought it. The vote runs on orch's group, made here the first time
        where the rank has none (a script made its own training group)."""
        due = self._library_stop.due(step)
        if due:
            self.stopped = True  # the library leaves its loop there: the rank ends STOPPED
        return due

    def settle_stop_vote(self) -> None:
        """The library's loop ended: wait for the stop vote still in flight, if any."""
        self._library_stop.settle()
