"""The per-rank table decided once (orch.views.rank_rows): each rank's marks and the folding of a
big run's rows, and that the terminal (rich and plain) and the notebook's HTML draw the same."""

from __future__ import annotations

import io
import math
import re

from rich.console import Console

from orch.views.rank_rows import MAX_TABLE_ROWS, MarkKind, rank_table
from orch.views.rendering import MARK_STYLES, render, run_table
from orch.views.run_html import MARK_LOOKS, table_html
from orch.wire.client import StateMirror
from orch.wire.ranks import RankView
from orch.wire.states import RankState, RunState

SGR = re.compile(r"\x1b\[[0-9;]*m")


def rich_lines(m: StateMirror, width: int = 200) -> list[str]:
    out = io.StringIO()
    Console(file=out, force_terminal=True, width=width, color_system="standard").print(run_table(m))
    return out.getvalue().splitlines()


def rich_row(m: StateMirror, rank: int) -> str:
    """The rich table's row of ``rank``, with its colours."""
    (line,) = [ln for ln in rich_lines(m) if SGR.sub("", ln)[:4].strip() == str(rank)]
    return line


def html_rows(page: str) -> dict[int, str]:
    rows = page.split('<tr class="orch-rank"')[1:]
    return {int(re.match(r' data-rank="(\d+)"', row).group(1)): row for row in rows}  # type: ignore[union-attr]


def failed_run() -> StateMirror:
    """Six ranks: a fine one, a NaN loss, the straggler, the root cause of the failure, one the
    failure stopped, and one whose memory grows (and that dropped points)."""
    m = StateMirror(run_id="r", state=RunState.FAILED, world_size=6, registered=6)
    m.ranks = [RankView(rank=i, host=f"h{i}", pid=10 + i, state=RankState.STOPPED, step=5) for i in range(6)]
    m.ranks[0].has_loss, m.ranks[0].loss = True, 1.5
    m.ranks[1].has_loss, m.ranks[1].loss = True, math.nan
    m.straggler_rank, m.straggler_section, m.straggler_note = 2, "compute", "rank 2 is the straggler"
    m.ranks[3].state, m.ranks[3].error = RankState.FAILED, "ValueError: bad"
    m.failure, m.root_cause_rank = "rank 3 (host h3, pid 13) failed: ValueError: bad", 3
    m.ranks[4].error = "stopped: rank 3 failed\nmore"
    m.ranks[5].memory_note, m.ranks[5].dropped_points = "memory grows 40 MB/min", 12
    return m


def test_each_rank_gets_the_marks_of_what_happened_to_it_and_no_other() -> None:
    table = rank_table(failed_run())
    assert table.more == "" and table.hidden == 0
    kinds = {row.rank: [mark.kind for mark in row.marks] for row in table.rows}
    assert kinds == {
        0: [],
        1: [MarkKind.NONFINITE],
        2: [MarkKind.STRAGGLER],
        3: [MarkKind.ROOT_CAUSE],
        4: [MarkKind.STOPPED_BY],
        5: [MarkKind.DROPPED, MarkKind.MEMORY],
    }
    rows = {row.rank: row for row in table.rows}
    assert rows[3].root_cause and not any(rows[i].root_cause for i in (0, 1, 2, 4, 5))
    assert rows[1].diverged and rows[1].loss == "nan" and rows[0].loss == "1.5"
    assert [mark.text for mark in rows[4].marks] == ["stopped: rank 3 failed"]  # its first line
    assert (
        rows[2].marks[0].text == "straggler: compute" and rows[2].marks[0].detail == "rank 2 is the straggler"
    )
    # A run that did not fail has no root cause, whatever root_cause_rank holds.
    ok = failed_run()
    ok.failure = ""
    assert not any(row.root_cause or row.mark(MarkKind.ROOT_CAUSE) for row in rank_table(ok).rows)


def test_every_view_draws_each_mark_on_its_ranks_row_only() -> None:
    m = failed_run()
    page = html_rows(table_html(m))
    plain = {int(line.split()[0]): line for line in render(m).splitlines() if line[:4].strip().isdigit()}
    for rank, words, html_class, style in (
        (1, "NaN/inf loss", "orch-nan", "\x1b[1;31m"),
        (2, "straggler: compute", "orch-slow", "\x1b[1;33m"),
        (3, "root cause", "orch-root-cause", "\x1b[1;31m"),
        (4, "stopped: rank 3 failed", "orch-stopped-by", "\x1b[2m"),
        (5, "memory grows 40 MB/min", "orch-memory", "\x1b[1;33m"),
    ):
        others = [r for r in range(6) if r != rank]
        assert f'class="{html_class}"' in page[rank] and words in page[rank], (rank, page[rank])
        assert not any(f'class="{html_class}"' in page[r] for r in others), html_class
        assert f"{style}{words}" in rich_row(m, rank), (rank, rich_row(m, rank))
        assert not any(words in SGR.sub("", rich_row(m, r)) for r in others), words
        assert words in plain[rank] and not any(words in plain[r] for r in others), words
    assert "<-" not in plain[0] and 'class="orch-marks"></td>' in page[0]


def test_every_mark_has_a_look_in_every_view() -> None:
    assert set(MARK_STYLES) == set(MarkKind) == set(MARK_LOOKS)


def test_a_stalled_runs_odd_rank_and_those_waiting_on_it_are_marked_in_both_views() -> None:
    m = StateMirror(run_id="s", state=RunState.RUNNING, world_size=3, stalled_for=9.0)
    m.ranks = [
        RankView(rank=i, state=RankState.RUNNING, step=5, progress_age=9.0, stack="wait" if i else "sleep")
        for i in range(3)
    ]
    rows = {row.rank: row for row in rank_table(m).rows}
    assert [mark.kind for mark in rows[0].marks] == [MarkKind.ODD]
    assert [mark.kind for mark in rows[1].marks] == [MarkKind.STILL] == [mark.kind for mark in rows[2].marks]
    assert rows[1].marks[0].text == "waiting on rank 0 for 9s"
    page = html_rows(table_html(m))
    assert 'class="orch-odd"' in page[0] and "the odd one out: no step for 9s" in page[0]
    assert all('class="orch-still"' in page[i] and "orch-odd" not in page[i] for i in (1, 2))
    assert "\x1b[1;31mthe odd one out" in rich_row(m, 0) and "\x1b[1;33mwaiting on rank 0" in rich_row(m, 1)


def test_a_big_run_is_folded_the_same_in_every_table_and_plain_text_keeps_every_rank() -> None:
    n = 3 * MAX_TABLE_ROWS
    m = StateMirror(run_id="big", state=RunState.RUNNING, world_size=n, registered=n)
    m.ranks = [RankView(rank=i, state=RankState.RUNNING, step=10, heartbeat_age=0.1) for i in range(n)]
    m.ranks[150].has_loss, m.ranks[150].loss = True, math.inf
    m.ranks[190].state = RankState.LOST
    table = rank_table(m)
    shown = [row.rank for row in table.rows]
    assert len(shown) == MAX_TABLE_ROWS and shown == sorted(shown)
    assert {150, 190} <= set(shown) and shown[:3] == [0, 1, 2]
    more = f"and {n - MAX_TABLE_ROWS:,} more ranks: {n - MAX_TABLE_ROWS:,} RUNNING"
    assert table.more == more and table.hidden == n - MAX_TABLE_ROWS

    page = table_html(m)
    assert [int(r) for r in re.findall(r'<tr class="orch-rank" data-rank="(\d+)"', page)] == shown
    assert f'<tr class="orch-more-ranks"><td colspan="11">{more}</td></tr>' in page
    lines = [SGR.sub("", line) for line in rich_lines(m, width=120)]
    rich_ranks = [int(line[:4]) for line in lines if line[:4].strip().isdigit()]
    assert rich_ranks == shown and more in lines
    assert "NaN/inf loss" in lines[lines.index(next(ln for ln in lines if ln[:4].strip() == "150"))]
    # The plain text (a file, a pipe, `orch status | grep`) has every rank, never a fold line.
    plain = render(m)
    assert "more ranks" not in plain and sum(line[:4].strip().isdigit() for line in plain.splitlines()) == n
    assert rank_table(m, max_rows=None).rows == tuple(rank_table(m, max_rows=n).rows)
