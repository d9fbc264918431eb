"""Each rank's step as a stacked bar, from the master's judgement to what the views draw: a
section marked with ctx.section is a part of its own with its colour and legend entry, the
straggler's part is outlined, and the times beside the bar say which they are."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from coordinator_calls import heartbeat
from orch.master.control.plan import RunPlan
from orch.master.coordinator import Coordinator
from orch.views.rendering import render, run_table
from orch.views.run_html import SECTION_COLORS, SPLIT_WIDTH_PX, table_html
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.client import StateMirror

pytestmark = pytest.mark.unit


def mirror_of(timings: dict[int, pb.StepTiming]) -> StateMirror:
    """A run of len(timings) ranks whose heartbeats carried these step times, judged twice."""
    clock = [100.0]
    n = len(timings)
    c = Coordinator(RunPlan(n), run_id="r", clock=lambda: clock[0])
    for i in range(n):
        c.register(pb.RegisterRequest(worker_id=f"w{i}", host="h", pid=i, rendezvous_port=1))
    for i in range(n):
        c.can_start(pb.CanStartTrainingRequest(run_id="r", worker_id=f"w{i}"))
    for t in range(3):
        clock[0] += 1.0
        for i, timing in timings.items():
            heartbeat(c, pb.HeartbeatRequest(run_id="r", worker_id=f"w{i}", step=10 * (t + 1), timing=timing))
        c.expire()  # a judgement a second: a straggler shows once two agree
    m = StateMirror()
    m.apply(c.snapshot())
    return m


def augment_run() -> StateMirror:
    # 10 steps of 100 ms per beat; every rank marks "augment". Rank 2 spends 77 ms of its step
    # there (the others 2 ms) and waits 1 ms in the collectives (the others 76 ms).
    def timing(augment: float, wait: float) -> pb.StepTiming:
        return pb.StepTiming(
            steps=10, step_seconds=1.0, data_seconds=0.02, collective_seconds=wait * 10,
            sections={"augment": augment * 10}, collectives=True, timed_by="ctx.steps",
        )  # fmt: skip

    return mirror_of({0: timing(0.002, 0.076), 1: timing(0.002, 0.076), 2: timing(0.077, 0.001)})


def parts_of(row: str) -> dict[str, str]:
    """data-part -> the whole <span> of that part, in one rank's row."""
    return {
        m.group(1): m.group(0)
        for m in re.finditer(r'<span class="orch-part[^"]*" data-part="([^"]+)"[^>]*>', row)
    }


def width(span: str) -> float:
    found = re.search(r"width:([0-9.]+)px", span)
    assert found is not None, span
    return float(found.group(1))


def test_a_section_is_a_part_of_the_bar_with_its_colour_and_legend_and_the_stragglers_is_outlined() -> None:
    m = augment_run()
    assert (m.straggler_rank, m.straggler_section) == (2, "augment"), m.straggler_note
    page = table_html(m)
    rows = page.split('<tr class="orch-rank"')[1:]
    assert len(rows) == 3
    for rank, row in enumerate(rows):
        parts = parts_of(row)
        # data, the section, the rest of compute, collective wait, other: in that order
        assert list(parts) == ["data", "augment", "compute", "collective wait", "other"], list(parts)
        assert f"background:{SECTION_COLORS[0]}" in parts["augment"]
        slow = "orch-slow-part" in parts["augment"]
        assert slow == (rank == 2), (rank, parts["augment"])
        assert not any("orch-slow-part" in parts[p] for p in parts if p != "augment")
    slow_parts, even_parts = parts_of(rows[2]), parts_of(rows[0])
    # rank 2: of its 97 ms of compute, 77 ms drawn as augment, the 20 ms left as compute
    assert width(slow_parts["augment"]) == pytest.approx(77 * SPLIT_WIDTH_PX / 100, abs=0.2)
    assert width(slow_parts["compute"]) == pytest.approx(20 * SPLIT_WIDTH_PX / 100, abs=0.2)
    assert (
        "outline:2px solid" in slow_parts["augment"] and "the straggler is slow here" in slow_parts["augment"]
    )
    assert width(even_parts["augment"]) == pytest.approx(2 * SPLIT_WIDTH_PX / 100, abs=0.2)
    # the legend has the section's colour, between data and compute
    legend = page[page.index('class="orch-legend"') :]
    keys = re.findall(r'class="orch-key" data-part="([^"]+)"', legend)
    assert keys == ["data", "augment", "compute", "collective wait", "other"], keys
    assert (
        f"background:{SECTION_COLORS[0]}" in legend.split('data-part="augment"')[1].split("</span></span>")[0]
    )
    # the times beside the bar say what they are: its own time, and the step's wall time
    assert 'class="orch-own"' in rows[2] and ">own 99.0</span>" in rows[2]
    assert ">100.0 ms</span>" in rows[2] and "under DDP every rank steps together" in rows[2]
    assert ">own 24.0</span>" in rows[0]


def test_the_terminal_dashboards_show_the_section_and_its_legend() -> None:
    m = augment_run()
    plain = render(m)
    row = next(line for line in plain.splitlines() if line.startswith("   2 "))
    assert "2/97/1/0 x" in row and row.split(" x")[1].split()[1:3] == ["augment", "77"], row
    assert "straggler: augment" in row
    console = Console(width=160, record=True, color_system="truecolor")
    console.print(run_table(m))
    text = console.export_text(clear=False)
    assert "sections (parts of compute): ██ augment" in text, text
    # the straggler's part drawn red, the section's part elsewhere green
    styled = console.export_text(styles=True)
    assert "\x1b[1;31m" in styled and "\x1b[32m" in styled


def test_a_step_timed_by_ctx_log_claims_no_data_part() -> None:
    def timing(wait: float) -> pb.StepTiming:
        return pb.StepTiming(
            steps=10, step_seconds=0.4, collective_seconds=wait * 10, collectives=True, timed_by="ctx.log"
        )

    m = mirror_of({0: timing(0.010), 1: timing(0.010), 2: timing(0.001)})
    assert (m.straggler_rank, m.straggler_section) == (2, "own time"), m.straggler_note
    page = table_html(m)
    rows = page.split('<tr class="orch-rank"')[1:]
    assert list(parts_of(rows[0])) == ["own time", "collective wait", "other"]
    assert "orch-slow-part" in parts_of(rows[2])["own time"]
    legend = page[page.index('class="orch-legend"') :]
    keys = re.findall(r'class="orch-key" data-part="([^"]+)"', legend)
    assert keys == ["own time", "collective wait", "other"], keys  # no data, no compute claimed
    assert "own time (timed by ctx.log: not split into data and compute)" in legend
    assert all(r.timed_by == "ctx.log" for r in m.ranks)
    row = next(line for line in render(m).splitlines() if line.startswith("   2 "))
    assert "-/39/1/0 x" in row and "straggler: own time" in row, row
