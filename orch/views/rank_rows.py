"""A run's per-rank table, decided once: a row per rank and its marks, and which rows show.

The terminal's rich view (:func:`orch.views.rendering.run_table`), its plain text
(:func:`orch.views.rendering.render`) and the notebook's HTML
(:func:`orch.views.run_html.table_html`) draw the same :class:`RankTable`: which rank is
the root cause, the straggler, NaN, the odd one out of a stalled run, short of memory... is
decided here, from a :class:`~orch.wire.client.StateMirror`, and each view only chooses
how a :class:`Mark` of each :class:`MarkKind` looks. Past :data:`MAX_TABLE_ROWS` ranks the
rows with something to say come first and a line counts the others (:func:`rank_table`).

The texts of a row are :func:`~orch._text.printable` and on one line already: a view escapes
them for its medium (HTML) or puts them into a ``rich.text.Text``, never into markup.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from orch._text import printable, rate_text, size_text
from orch.wire.client import StateMirror
from orch.wire.ranks import RankView
from orch.wire.states import RankState

STILL_AFTER = 5.0  # seconds without a step after which a rank of a stalled run is marked

# Rows of the rank table at most: past it the ranks with something to say come first, then
# the others in order, and one line counts the rest (4,096 rows cost the panel more than its
# plot and a terminal cannot show them: `orch status --json` and run.state() have every rank).
MAX_TABLE_ROWS = 64

ENDED_BADLY = (RankState.FAILED, RankState.LOST, RankState.STOPPED)


class MarkKind(enum.Enum):
    """What a mark on a rank's row says, in the order a row lists them."""

    ROOT_CAUSE = "root cause"  # the rank whose failure ended the run
    STRAGGLER = "straggler"  # the rank the master judged to hold the others back
    NONFINITE = "nonfinite"  # a logged value went NaN or infinite
    DROPPED = "dropped"  # logged points never reached the master
    ODD = "odd"  # a stalled run's rank whose stack differs: the one the others wait on
    STILL = "still"  # a stalled run's rank whose step stands still
    MEMORY = "memory"  # its memory grows, or nears its limit
    NOTE = "note"  # the last warning its code raised about the run
    STOPPED_BY = "stopped by"  # stopped because another rank failed


@dataclass(frozen=True)
class Mark:
    """One mark on a rank's row: its kind and its words (``detail``: more, for a tooltip)."""

    kind: MarkKind
    text: str
    detail: str = ""


@dataclass(frozen=True)
class RankRow:
    """A rank as every view's table shows it; ``view`` holds the rest (its step's split, which
    each view draws its own way)."""

    rank: int
    host: str
    pid: int
    state: RankState
    step: int
    loss: str
    diverged: bool  # its last loss is NaN or infinite
    rate: str  # steps/s: its rate while it runs, its mean once it ended
    heartbeat: str  # seconds since its last heartbeat ("-": none yet)
    memory: str
    marks: tuple[Mark, ...]
    root_cause: bool
    view: RankView

    @property
    def has_something_to_say(self) -> bool:
        """A mark, or a state it ended badly in: folded last, never first."""
        return bool(self.marks) or self.state in ENDED_BADLY

    def mark(self, kind: MarkKind) -> Mark | None:
        return next((mark for mark in self.marks if mark.kind is kind), None)


@dataclass(frozen=True)
class RankTable:
    """The rows a table shows, in rank order, and the line that counts the others (``more``:
    ``and 192 more ranks: 190 RUNNING, 2 SUCCEEDED``; "" when every rank shows)."""

    rows: tuple[RankRow, ...]
    more: str = ""
    hidden: int = 0


def still(mirror: StateMirror, r: RankView) -> bool:
    """``r`` is a running rank of a run that is not progressing, and its step stands still."""
    return mirror.stalled_for > 0 and r.state is RankState.RUNNING and r.progress_age >= STILL_AFTER


def odd_ranks(mirror: StateMirror) -> set[int]:
    """The ranks of a stalled run (live, or that ended stalled) whose last stack differs from the
    one most ranks share: the hung rank the others wait on in a collective (none when no stack
    is shared by more ranks than any other)."""
    if mirror.stalled_for <= 0:
        return set()
    by_stack: dict[str, list[int]] = {}
    for r in mirror.ranks:
        if r.stack:
            by_stack.setdefault(r.stack, []).append(r.rank)
    groups = sorted(by_stack.values(), key=len, reverse=True)
    if len(groups) < 2 or len(groups[0]) == len(groups[1]):
        return set()
    return {rank for ranks in groups[1:] for rank in ranks}


def nonfinite_marks(mirror: StateMirror) -> dict[int, str]:
    """Each rank whose metric went NaN or inf, and the words its row is marked with: ``loss nan
    from step 45 (last finite 6.433e+35 at step 44)``; a rank whose last loss is not finite but
    whose points are not here (a poll without series) is marked ``NaN/inf loss``."""
    marks: dict[int, list[str]] = {}
    for d in mirror.nonfinite():
        marks.setdefault(d.rank, []).append(d.text())
    out = {rank: "; ".join(texts) for rank, texts in marks.items()}
    for r in mirror.ranks:
        if r.diverged and r.rank not in out:
            out[r.rank] = "NaN/inf loss"
    return out


def stragglers(mirror: StateMirror) -> set[int]:
    """The rank the master judged to hold the others back (see orch.master.control.stragglers)."""
    return {mirror.straggler_rank} if mirror.straggler_rank >= 0 else set()


def rate_of(r: RankView) -> str:
    """A rank's steps/s: its rate while it runs, its mean over the run once it ended."""
    return rate_text(r.steps_per_sec) + (" mean" if r.state.done and r.steps_per_sec else "")


def memory_text(r: RankView) -> str:
    """``1.2 GB 97%``: a rank's resident memory and CPU share at its last beat (``-``: not
    read), and with CUDA the memory torch allocated on its GPU (``gpu 3.1 GB``)."""
    if not r.rss_bytes:
        return "-"
    text = f"{size_text(r.rss_bytes)} {r.cpu_percent:.0f}%"
    return text + (f" gpu {size_text(r.cuda_allocated)}" if r.cuda_total else "")


def dropped_text(r: RankView) -> str:
    """How many of the rank's logged points never reached the master, and why."""
    text = f"{r.dropped_points:,} points dropped"
    return f"{text}: {printable(r.dropped_reason, one_line=True)}" if r.dropped_reason else text


def stall_mark(m: StateMirror, r: RankView, odd: set[int]) -> str:
    """A stalled run's rank: the odd one out, or waiting on it ("" for a rank that moves)."""
    if r.rank in odd:
        return f"the odd one out: no step for {r.progress_age:.0f}s" if still(m, r) else "the odd one out"
    if still(m, r):
        waiting = f"waiting on rank {min(odd)}" if len(odd) == 1 else "no step"
        return f"{waiting} for {r.progress_age:.0f}s"
    return ""


def _marks(
    m: StateMirror, r: RankView, root: bool, slow: set[int], bad: dict[int, str], odd: set[int]
) -> list[Mark]:
    marks = []
    if root:
        marks.append(Mark(MarkKind.ROOT_CAUSE, "root cause"))
    if r.rank in slow:
        section = printable(m.straggler_section, one_line=True)
        why = printable(m.straggler_note, one_line=True)
        marks.append(Mark(MarkKind.STRAGGLER, f"straggler: {section}", why))
    if r.rank in bad:
        marks.append(Mark(MarkKind.NONFINITE, printable(bad[r.rank], one_line=True)))
    if r.dropped_points:
        marks.append(Mark(MarkKind.DROPPED, dropped_text(r)))
    if stall := stall_mark(m, r, odd):
        marks.append(Mark(MarkKind.ODD if r.rank in odd else MarkKind.STILL, stall))
    if r.memory_note:
        marks.append(Mark(MarkKind.MEMORY, printable(r.memory_note, one_line=True)))
    if r.note:
        marks.append(Mark(MarkKind.NOTE, printable(r.note, one_line=True)))
    if r.state is RankState.STOPPED and r.error.startswith("stopped: "):  # ended by another's failure
        marks.append(Mark(MarkKind.STOPPED_BY, printable(r.error.splitlines()[0], one_line=True)))
    return marks


def rank_rows(m: StateMirror) -> list[RankRow]:
    """A row per rank of the run, in rank order, each with its marks."""
    slow, bad, odd = stragglers(m), nonfinite_marks(m), odd_ranks(m)
    rows = []
    for r in m.ranks:
        root = bool(m.failure) and r.rank == m.root_cause_rank
        rows.append(
            RankRow(
                rank=r.rank,
                host=printable(r.host, one_line=True),  # what the worker says its host is called
                pid=r.pid,
                state=r.state,
                step=r.step,
                loss=r.loss_text(),
                diverged=r.diverged,
                rate=rate_of(r),
                heartbeat="-" if r.heartbeat_age < 0 else f"{r.heartbeat_age:.1f}s",
                memory=memory_text(r),
                marks=tuple(_marks(m, r, root, slow, bad, odd)),
                root_cause=root,
                view=r,
            )
        )
    return rows


def fold(rows: list[RankRow], max_rows: int = MAX_TABLE_ROWS) -> RankTable:
    """At most ``max_rows`` of ``rows``: those with something to say first, then the others in
    order, shown in rank order; and the line that counts the rest by state."""
    if len(rows) <= max_rows:
        return RankTable(tuple(rows))
    first = [row for row in rows if row.has_something_to_say][:max_rows]
    rest = [row for row in rows if not row.has_something_to_say][: max_rows - len(first)]
    shown = sorted(first + rest, key=lambda row: row.rank)
    seen = {row.rank for row in shown}
    states: dict[str, int] = {}
    for row in rows:
        if row.rank not in seen:
            states[row.state.value] = states.get(row.state.value, 0) + 1
    counts = ", ".join(f"{n:,} {state}" for state, n in sorted(states.items(), key=lambda kv: -kv[1]))
    hidden = len(rows) - len(shown)
    return RankTable(tuple(shown), f"and {hidden:,} more ranks: {counts}", hidden)


def rank_table(m: StateMirror, max_rows: int | None = MAX_TABLE_ROWS) -> RankTable:
    """The run's rank table: its rows, folded past ``max_rows`` (None: every rank)."""
    rows = rank_rows(m)
    return RankTable(tuple(rows)) if max_rows is None else fold(rows, max_rows)
