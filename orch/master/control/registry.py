"""The ranks of one attempt: who registered, in which order, and the start barrier."""

from __future__ import annotations

from bisect import insort
from collections import deque
from dataclasses import dataclass, field

from orch.master.control.memory import MemoryWindow
from orch.master.control.stragglers import TimingWindow
from orch.master.control.validate import Reject
from orch.wire.model import Barrier, Registration, Stack
from orch.wire.ranks import RankView
from orch.wire.stacks import format_stack
from orch.wire.states import RankState


@dataclass(eq=False)
class RankRecord(RankView):
    """A live rank as the master keeps it: the shared record plus what only the master uses.
    Records are compared by identity: two ranks are never the same rank."""

    __eq__ = object.__eq__
    __hash__ = object.__hash__

    rendezvous_port: int = 0  # where rank 0's torch.distributed store listens
    backend: str = ""
    last_heartbeat: float | None = None  # the master's clock
    last_series: int | None = None  # the fingerprint of its last beat's points (see Intake.beat)
    resent: bool = False  # its last beat was one sent again: nothing of it to write
    ended_at: float | None = None
    beats: int = 0
    progress: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=16))
    timing: TimingWindow = field(default_factory=TimingWindow)
    # Progress (orch.master.control.progress): when its step last advanced (the master's clock;
    # set when the barrier lets it through) and the seconds between its last advances.
    moved_at: float | None = None
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=32))
    # Its training thread's stack: asked for in its next heartbeat's reply, kept as sent.
    stack_wanted: bool = False
    stack_sent: Stack | None = None
    stack_at: float | None = None  # the master's clock when it arrived
    forced: bool = False  # ended by the master (a stop past its grace), not by its own report
    many_sections: bool = False  # it marked more ctx.section names than are timed apart
    memory: MemoryWindow = field(default_factory=MemoryWindow)
    # What clients were last sent of it (see orch.master.control.published): what they see of
    # it, its serialized RankInfo, and the publication that built it.
    published_as: tuple[tuple[object, ...], bytes, int] | None = field(default=None, repr=False)

    def steps_per_second(self) -> float:
        if len(self.progress) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self.progress[0], self.progress[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

    def take_stack(self, stack: Stack, now: float) -> None:
        """The stack its heartbeat carried (asked for, or sent on its own)."""
        self.stack_sent = stack
        self.stack = format_stack(stack)
        self.stack_at = now
        self.stack_wanted = False

    def beat(
        self, now: float, step: int, total_steps: int, dropped_points: int, dropped_reason: str = ""
    ) -> None:
        """A heartbeat arrived. An ended rank may still deliver the points it logged before
        it ended: they count as steps it did, but not towards its rate."""
        self.last_heartbeat = now
        self.beats += 1
        if step > self.step:
            # The first advance's wait holds start-up (or a resumed run's jump): no pace in it.
            if self.moved_at is not None and self.step > 0:
                self.gaps.append(now - self.moved_at)
            self.moved_at = now
        self.step = max(self.step, step)
        if not self.state.done:
            if total_steps:
                self.total_steps = total_steps
            self.progress.append((now, self.step))
        self.dropped_points = dropped_points
        if dropped_reason:
            self.dropped_reason = dropped_reason

    def refused(self, now: float, why: str) -> None:
        """A heartbeat refused for what it carries: its process lives (the rank counts as
        alive, and as having beaten since the barrier); its sender drops its points."""
        self.last_heartbeat = now
        self.beats += 1
        self.dropped_reason = f"the master refused a heartbeat: {why}"


class Registry:
    """The ranks of the current attempt, in rank order.

    A worker started by a launcher (torchrun, srun) asks for the rank its launcher gave it
    and gets that one or a refusal; any other worker gets the lowest free rank, so that
    without requests the rank is the registration order.
    """

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.ranks: list[RankRecord] = []
        self._by_worker: dict[str, RankRecord] = {}
        self._by_rank: dict[int, RankRecord] = {}
        self._blocks: dict[str, range] = {}  # a host agent's group -> its block of ranks

    @property
    def full(self) -> bool:
        return len(self.ranks) == self.world_size

    def get(self, worker_id: str) -> RankRecord | None:
        return self._by_worker.get(worker_id)

    def known(self, worker_id: str, run_id: str) -> RankRecord:
        rec = self._by_worker.get(worker_id)
        if rec is None:
            raise Reject("not_found", f"no worker {worker_id!r} is registered in run {run_id}")
        return rec

    def add(self, req: Registration, run_id: str) -> tuple[RankRecord, bool]:
        """The worker's record, and True when it is new (a retried Register gets the same rank)."""
        rec = self._by_worker.get(req.worker_id)
        if rec is not None:
            if req.rendezvous_port:
                rec.rendezvous_port = req.rendezvous_port  # rank 0 tells where its store listens
            return rec, False
        if req.world_size and req.world_size != self.world_size:
            raise Reject(
                "failed_precondition",
                f"worker {req.worker_id} was started with world size {req.world_size} (by its "
                f"launcher) but run {run_id} has world size {self.world_size}: start as many tasks as "
                "the master's --world-size, or start the master with the launcher's world size",
            )
        if req.rank is not None:
            rank = self._requested(req, run_id)
        elif self.full:
            raise Reject(
                "resource_exhausted", f"run {run_id} already has all {self.world_size} ranks registered"
            )
        else:
            in_block = self._in_block(req)
            if in_block is not None:
                rank = in_block
            else:
                free = [r for r in range(self.world_size) if r not in self._by_rank]
                held = {r for block in self._blocks.values() for r in block}
                rank = next((r for r in free if r not in held), free[0])
        rec = RankRecord(
            rank=rank,
            worker_id=req.worker_id,
            host=req.host,
            pid=req.pid,
            address=req.address or req.host,
            rendezvous_port=req.rendezvous_port,
            backend=req.backend,
        )
        insort(self.ranks, rec, key=lambda r: r.rank)
        self._by_worker[req.worker_id] = rec
        self._by_rank[rank] = rec
        return rec, True

    def _in_block(self, req: Registration) -> int | None:
        """The rank of a host agent's worker: its group's block (the first whole free one, on a
        multiple of the group's size) at its local rank; None when it has no group or no block
        fits (then the lowest free rank)."""
        size = req.local_world_size
        if not req.group or size <= 1 or not 0 <= req.local_rank < size:
            return None
        block = self._blocks.get(req.group)
        if block is None:
            held = {r for b in self._blocks.values() for r in b}
            block = next(
                (
                    range(start, start + size)
                    for start in range(0, self.world_size - size + 1, size)
                    if not any(r in self._by_rank or r in held for r in range(start, start + size))
                ),
                None,
            )
            if block is None or len(block) != size:
                return None
            self._blocks[req.group] = block
        rank = block[req.local_rank]
        return rank if rank not in self._by_rank else None

    def _requested(self, req: Registration, run_id: str) -> int:
        """The rank the worker asked for, if it is free and in range."""
        rank = req.rank or 0
        if rank >= self.world_size:
            raise Reject(
                "invalid_argument",
                f"worker {req.worker_id} asked for rank {rank}, but run {run_id} has world size "
                f"{self.world_size} (ranks 0-{self.world_size - 1})",
            )
        holder = self._by_rank.get(rank)
        if holder is not None:
            raise Reject(
                "already_exists",
                f"worker {req.worker_id} asked for rank {rank}, which worker {holder.worker_id} "
                f"(host {holder.host}, pid {holder.pid}) already holds in run {run_id}: each "
                "launcher task needs its own rank, and each run its own master",
            )
        return rank

    @property
    def rank0(self) -> RankRecord | None:
        """Rank 0's record (it serves the rendezvous), once it registered."""
        return self._by_rank.get(0)

    def rendezvous_port(self, fixed: int) -> int:
        """The rendezvous port in use: the fixed one, or the one rank 0 bound (0: not yet)."""
        rank0 = self.rank0
        return fixed or (rank0.rendezvous_port if rank0 is not None else 0)

    def barrier(
        self,
        rec: RankRecord,
        *,
        open_: bool,
        fixed_port: int,
        backend: str,
        now: float,
        file_store: bool = False,
    ) -> Barrier:
        """The start barrier, as ``rec`` sees it: open once every rank registered, the run
        is RUNNING (``open_``) and rank 0 said where its store listens (or, with a
        ``file_store`` on one host, at once: the ranks know the file)."""
        port = 0 if file_store else self.rendezvous_port(fixed_port)
        ready = open_ and self.full and (port > 0 or file_store)
        if not ready:
            return Barrier(False, len(self.ranks), self.world_size)
        if rec.state is RankState.REGISTERED:
            rec.state = RankState.RUNNING
            rec.last_heartbeat = rec.moved_at = now
        return Barrier(
            True,
            len(self.ranks),
            self.world_size,
            master_addr=self.ranks[0].address,  # rank 0: the ranks are in rank order
            master_port=port,
            backend=backend or ("nccl" if all(r.backend == "nccl" for r in self.ranks) else "gloo"),
        )

    def silent(self, now: float, timeout: float) -> list[RankRecord]:
        """Running ranks whose last heartbeat is older than ``timeout``."""
        return [
            r
            for r in self.ranks
            if r.state is RankState.RUNNING
            and r.last_heartbeat is not None
            and now - r.last_heartbeat > timeout
        ]

    def reported(self, worker_id: str) -> bool:
        """True when the worker's rank reported its end (or its process exited), unlike a LOST one."""
        rec = self._by_worker.get(worker_id)
        return rec is not None and rec.state.done and rec.state is not RankState.LOST and not rec.forced
