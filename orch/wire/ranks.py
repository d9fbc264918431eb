"""The rank record: one definition of what orch knows about a rank, mapped to and from the
protocol's ``RankInfo`` and the run dir's JSON in one place (the fields are walked, not
copied by hand, so a field added here reaches every view).

The master keeps its live ranks as :class:`orch.master.control.registry.RankRecord`, this record
plus what only the master needs; clients, ``result.json`` and ``orch.load_run`` see this one.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from orch._text import number_text
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.states import RANK_STATE_FROM_PB, RANK_STATE_PB, RankState


class FieldReader(Protocol):
    """Typed access to one JSON object (the run dir's reader checks each value's type)."""

    def integer(self, key: str, default: int | None = 0) -> int: ...
    def text(self, key: str, default: str = "") -> str: ...
    def number(self, key: str, default: float = 0.0) -> float: ...
    def flag(self, key: str, default: bool = False) -> bool: ...
    def numbers(self, key: str) -> dict[str, float]: ...


@dataclass
class RankView:
    rank: int
    worker_id: str = ""
    host: str = ""
    pid: int = 0
    state: RankState = RankState.REGISTERED
    step: int = 0
    total_steps: int = 0
    steps_per_sec: float = 0.0  # live: its rate now; once it ended, its mean (StateMirror.fill_mean_rates)
    heartbeat_age: float = -1.0  # seconds since its last heartbeat; -1: none yet (or on disk)
    loss: float = math.nan
    param_checksum: str = ""
    error: str = ""
    exit_code: int = 0
    address: str = ""
    has_loss: bool = False
    dropped_points: int = 0  # points of ctx.log's that never reached the master (queue full, or refused)
    # Where a step's time goes, per step over the last few seconds (live; on disk, the last seen).
    timed: bool = False
    step_ms: float = 0.0
    data_ms: float = 0.0
    compute_ms: float = 0.0
    collective_ms: float = 0.0
    other_ms: float = 0.0
    relative_score: float = 0.0  # compute against the fastest rank's (1.0: the fastest)
    individual_score: float = 0.0  # compute against this rank's own best (1.0: its best)
    slow_in: str = ""  # the part of the step it is slow in, when it is the straggler
    progress_age: float = -1.0  # live only: seconds since its step last advanced (-1: not running)
    stack: str = ""  # its training thread's last stack, as a traceback (empty: none taken)
    # Its process at its last beat (see the protocol's ProcessStats); 0: not read.
    rss_bytes: int = 0
    cpu_percent: float = 0.0
    cuda_allocated: int = 0
    cuda_reserved: int = 0
    cuda_peak: int = 0
    cuda_total: int = 0
    memory_limit: int = 0
    limit_kind: str = ""
    memory_note: str = ""  # a warning about its memory: growing, or near its limit
    note: str = ""  # the last warning its code raised about the run (a library's world size)
    dropped_reason: str = ""  # why it last dropped points (see dropped_points)
    # What marks the steps its times are of: "ctx.steps", "ctx.data" (each batch), "ctx.log"
    # (from one logged step to the next: its step is not split into data and compute).
    timed_by: str = ""
    section_ms: dict[str, float] = field(default_factory=dict)  # its ctx.section parts of compute_ms

    @property
    def own_ms(self) -> float:
        """Its own time per step: the step's wall time less its wait for its peers."""
        return max(0.0, self.step_ms - self.collective_ms)

    @property
    def diverged(self) -> bool:
        """The last logged loss is NaN or infinite."""
        return self.has_loss and not math.isfinite(self.loss)

    def loss_text(self) -> str:
        if not self.has_loss:
            return "-"
        return number_text(self.loss)

    def to_pb(self) -> pb.RankInfo:
        values = {f.name: getattr(self, f.name) for f in _FIELDS}
        values["state"] = RANK_STATE_PB[self.state.value]
        return pb.RankInfo(**values)

    @classmethod
    def from_pb(cls, r: pb.RankInfo) -> RankView:
        values = {f.name: getattr(r, f.name) for f in _FIELDS}
        values["state"] = RANK_STATE_FROM_PB.get(r.state, RankState.REGISTERED)
        values["section_ms"] = dict(r.section_ms)
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (a NaN or infinite loss becomes its text, which JSON has no number for)."""
        d = {f.name: getattr(self, f.name) for f in _FIELDS}
        d["state"] = self.state.value
        d["section_ms"] = dict(self.section_ms)
        if not math.isfinite(d["loss"]):
            d["loss"] = str(d["loss"])
        return d

    @classmethod
    def from_fields(cls, r: FieldReader, state: RankState) -> RankView:
        """From a JSON object written by :meth:`as_dict`; the live-only fields read as unknown."""
        values: dict[str, Any] = {"state": state}
        for f in _FIELDS:
            if f.name in ("state", "heartbeat_age", "progress_age"):
                continue
            if f.name == "rank":
                values["rank"] = r.integer("rank", None)
            elif f.name == "loss":
                values["loss"] = r.number("loss", math.nan)
            elif f.type == "int":
                values[f.name] = r.integer(f.name)
            elif f.type == "str":
                values[f.name] = r.text(f.name)
            elif f.type == "bool":
                values[f.name] = r.flag(f.name)
            elif f.name == "section_ms":
                values[f.name] = r.numbers(f.name)
            else:
                values[f.name] = r.number(f.name)
        return cls(**values)


_FIELDS = dataclasses.fields(RankView)


def loss_name(names: set[str]) -> str:
    """The metric a rank's "loss" column shows: ``loss``, else the first by name of those that end
    in it (``train/loss``, ``train_loss``: a SummaryWriter tag, Lightning's ``self.log``)."""
    if "loss" in names:
        return "loss"
    ends = sorted(n for n in names if n.lower().endswith("loss") and not n.lower().startswith("val"))
    return ends[0] if ends else "loss"
