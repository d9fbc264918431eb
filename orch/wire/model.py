"""A run as plain values: what the master says of it, apart from the protocol that carries it.

:class:`RunStatus` is a run's own fields (not its ranks, points or events): the master's
reply builds it, :mod:`.codec` puts it on the wire and takes it off, the client's mirror holds
it, ``result.json`` keeps it and a run dir's loader reads it back, each by walking its fields.
A new run-level field is declared here once (with where it goes in ``result.json``), set where
the master decides it, and shown by a view; nothing in between copies it by name.
:class:`JobView` is the scheduler's job and :class:`Event` one entry of the run's event log.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from orch.wire.states import RankState, RunState


@dataclass(frozen=True)
class JobView:
    """The scheduler's job a run's ranks run in, as the scheduler last reported it."""

    scheduler: str
    job_id: str
    state: str
    reason: str = ""
    nodes: str = ""

    def describe(self) -> str:
        """``slurm job 41: PENDING in the queue: Resources`` or ``slurm job 41: RUNNING on node[1-2]``."""
        head = f"{self.scheduler} job {self.job_id}: {self.state or 'submitted'}"
        if self.state == "PENDING":
            why = self.reason if self.reason not in ("", "None") else ""
            return head + " in the queue" + (f": {why}" if why else "")
        return head + (f" on {self.nodes}" if self.nodes else "")

    def news(self, before: JobView | None) -> str | None:
        """What this word of the scheduler's tells after ``before`` (None: nothing new)."""
        said = (self.state, self.reason, self.nodes)
        if before is not None and (before.state, before.reason, before.nodes) == said:
            return None
        where = f" on {self.nodes}" if self.nodes else ""
        why = f" ({self.reason})" if self.reason and self.reason != "None" else ""  # squeue's "no reason"
        return f"{self.scheduler} job {self.job_id} {self.state}{why}{where}"

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Event:
    """One entry of a run's event log: when (time of day), what kind, which rank (-1: the run)."""

    time: float
    kind: str
    rank: int
    message: str


def _at(place: str, digits: int | None = None) -> dict[str, Any]:
    """A field kept in ``result.json`` under ``place`` ("group.key" for a nested one), rounded
    to ``digits`` there."""
    return {"json": place, "digits": digits}


@dataclass
class RunStatus:
    """A run's own state, as the master last told it."""

    run_id: str = field(default="", metadata=_at("run_id"))
    state: RunState = field(default=RunState.PENDING, metadata=_at("state"))
    world_size: int = field(default=0, metadata=_at("world_size"))
    registered: int = field(default=0, metadata=_at("registered"))
    total_steps: int = field(default=0, metadata=_at("total_steps"))
    elapsed: float = field(default=0.0, metadata=_at("elapsed", digits=3))
    failure: str = field(default="", metadata=_at("failure"))
    root_cause_rank: int = field(default=-1, metadata=_at("root_cause_rank"))
    root_cause_error: str = field(default="", metadata=_at("root_cause_error"))
    root_cause_exit_code: int = field(default=0, metadata=_at("root_cause_exit_code"))
    attempt: int = field(default=1, metadata=_at("attempt"))
    max_attempts: int = field(default=1, metadata=_at("max_attempts"))
    rendezvous: str = field(default="", metadata=_at("rendezvous"))
    job: JobView | None = field(default=None, metadata=_at("job"))  # the scheduler's job (a Slurm or Ray run)
    stragglers_judged: bool = field(
        default=False, metadata=_at("stragglers.judged")
    )  # False: the note says why not
    straggler_rank: int = field(default=-1, metadata=_at("stragglers.rank"))
    straggler_section: str = field(default="", metadata=_at("stragglers.section"))
    straggler_note: str = field(default="", metadata=_at("stragglers.note"))
    # Whether the ranks progress: seconds the stalled ranks stood still (0: the run moves),
    # the note in words, and the ranks' last stacks grouped by frame.
    stalled_for: float = field(default=0.0, metadata=_at("progress.stalled_for", digits=3))
    progress_note: str = field(default="", metadata=_at("progress.note"))
    stacks: str = field(default="", metadata=_at("progress.stacks"))
    stacks_taken: float = field(default=0.0, metadata=_at("progress.stacks_taken"))
    # Before the first step: what the run does, in words, and the seconds its start-up took so far.
    startup_note: str = field(default="", metadata=_at("startup.note"))
    startup_seconds: float = field(default=0.0, metadata=_at("startup.seconds", digits=3))

    def settled(self) -> RunStatus:
        """This status, as a master of any version meant it: a master without the straggler
        judgement leaves its fields unset (no rank is marked), an old one the attempts."""
        self.attempt, self.max_attempts = self.attempt or 1, self.max_attempts or 1
        if not self.stragglers_judged:
            self.straggler_rank = -1
        if self.straggler_rank < 0:
            self.straggler_section = ""
        return self

    def status(self) -> RunStatus:
        """These fields alone, as a :class:`RunStatus` (of a mirror that holds more)."""
        return RunStatus(**{f.name: getattr(self, f.name) for f in STATUS_FIELDS})

    def take(self, status: RunStatus) -> None:
        """Hold ``status``'s fields."""
        for f in STATUS_FIELDS:
            setattr(self, f.name, getattr(status, f.name))

    def status_json(self) -> dict[str, Any]:
        """The fields as ``result.json`` keeps them (nested where their place says so)."""
        out: dict[str, Any] = {}
        for f in STATUS_FIELDS:
            value = getattr(self, f.name)
            if isinstance(value, RunState):
                value = value.value
            elif isinstance(value, JobView):
                value = value.as_dict()
            elif f.metadata["digits"] is not None:
                value = round(value, f.metadata["digits"])
            group, _, key = f.metadata["json"].rpartition(".")
            (out.setdefault(group, {}) if group else out)[key] = value
        return out


STATUS_FIELDS = dataclasses.fields(RunStatus)


@dataclass(slots=True)
class Points:
    """One metric's points from one heartbeat: steps, values and (unix) times, in order."""

    name: str
    steps: Sequence[int]
    values: Sequence[float]
    times: Sequence[float] = ()  # empty: the master stamps them with the beat's arrival
    rank: int = 0  # in a reply: whose they are (a beat's are its rank's)


@dataclass(frozen=True)
class MetricBatch:
    """One record of a run's metrics log: a rank's points of one attempt, as one beat sent them."""

    rank: int
    attempt: int
    series: list[Points]


# -- what workers and host agents tell the master, and what it answers, as plain values ------------
# Each mirrors one protocol message field by field (same names; see codec.MESSAGES): a field
# the protocol marks optional is None when not sent.


@dataclass(frozen=True)
class Registration:
    """A worker asks for its rank (``Register``)."""

    worker_id: str
    host: str = ""
    pid: int = 0
    address: str = ""  # where the other ranks reach it
    rendezvous_port: int = 0  # rank 0 registers again with the port its store bound
    local_rank: int = 0
    backend: str = ""  # what it can run: "gloo" or "nccl"
    run_id: str = ""  # the run it expects to join ("": any)
    rank: int | None = None  # the rank its launcher gave it (torchrun, Slurm), if any
    world_size: int = 0  # its launcher's world size (0: not said)
    group: str = ""  # a host agent's workers: one block of ranks per group
    local_world_size: int = 0


@dataclass(frozen=True)
class Barrier:
    """The start barrier as one worker sees it (``CanStartTraining``'s answer)."""

    ready: bool
    registered: int
    world_size: int
    master_addr: str = ""  # the rendezvous, once ready
    master_port: int = 0
    backend: str = ""


@dataclass(frozen=True)
class Completion:
    """A rank's end, as it reports it or its host agent saw it (``Complete``)."""

    run_id: str = ""
    worker_id: str = ""
    outcome: RankState | None = None  # SUCCEEDED, FAILED or STOPPED
    error: str = ""  # the traceback when it failed
    param_checksum: str = ""
    step: int = 0
    exit_code: int = 0  # its host agent saw its process die with this (negative: a signal)


@dataclass(frozen=True)
class HostReport:
    """A host agent's word on its ranks (``SyncHost``)."""

    host: str  # "hostname:pid"
    attempt: int = 0  # the attempt its ranks belong to (0: it started none yet)
    worker_ids: Sequence[str] = ()
    running: bool = False  # some of those ranks' processes still run
    failure: str = ""  # ranks that died before they registered


class Command(str, Enum):
    """What a heartbeat's reply tells its rank to do."""

    CONTINUE = "CONTINUE"
    STOP = "STOP"  # at the stop step
    ABORT = "ABORT"  # now: the run failed, or the stop's grace is over


class HostAction(str, Enum):
    """What a host agent does next."""

    CONTINUE = "CONTINUE"
    START = "START"  # start the ranks of the current attempt
    WAIT = "WAIT"  # a restart is under way
    EXIT = "EXIT"  # the run ended, or the host was left out


@dataclass(slots=True)
class StepTiming:
    """Where a rank's steps since its last beat spent their time."""

    steps: int = 0  # steps timed (by what timed_by names)
    step_seconds: float = 0.0  # their wall time, from one step's start to the next's
    data_seconds: float = 0.0  # waiting for the next batch
    collective_seconds: float = 0.0  # waiting for peers in gradient collectives
    other_seconds: float = 0.0  # orch's own work between steps
    sections: Mapping[str, float] = field(default_factory=dict)  # ctx.section's names
    collectives: bool = False  # gradient collectives are timed
    timed_by: str = ""  # "ctx.steps", "ctx.log", "off" ("": not said)


@dataclass(slots=True)
class ProcessStats:
    """A rank's process, read at one beat: memory, CPU, the GPU's memory, the tightest limit."""

    rss_bytes: int = 0
    cpu_percent: float = 0.0
    cuda_allocated: int = 0
    cuda_reserved: int = 0
    cuda_peak: int = 0
    cuda_total: int = 0
    memory_limit: int = 0  # 0: none known
    limit_kind: str = ""  # "cgroup", "RLIMIT_AS" or "machine"
    oom_kills: int = 0  # OOM kills its cgroup counted
    limit_used: int = 0  # what the limit counts now


@dataclass(slots=True)
class Frame:
    """One frame of a stack."""

    file: str = ""  # a path, or "Cell In[3]"
    line: int = 0
    function: str = ""
    code: str = ""  # the source line, stripped
    user: bool = False  # the user's code, not Python's, torch's, orch's or a package's


@dataclass(slots=True)
class Stack:
    """A rank's training thread's stack, outermost frame first."""

    frames: Sequence[Frame] = ()
    taken: float = 0.0  # unix seconds
    step: int = 0  # the rank's progress when it was taken
    note: str = ""  # where it came from when not the heartbeat thread (py-spy), or why none


@dataclass(slots=True)
class Beat:
    """A rank's heartbeat: its progress, its points since the last one, and how it fares."""

    run_id: str = ""
    worker_id: str = ""
    step: int = 0  # the last step it reached
    total_steps: int = 0  # 0: not known
    series: Sequence[Points] = ()
    dropped_points: int = 0  # points it dropped so far
    timing: StepTiming | None = None
    process: ProcessStats | None = None
    stack: Stack | None = None  # when the master asked for it
    dropped_reason: str = ""
    note: str = ""  # a warning of its code's
