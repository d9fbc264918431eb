"""The terminal dashboards: the plain text and the rich views of a run (from a state built by the
master's own logic) and of a sweep, drawn on a terminal, and `orch run` under a pseudo-terminal."""

from __future__ import annotations

import io
import math
import os
import pty
import re
import select
import signal
import time
from pathlib import Path
from typing import Any, cast

import pytest
from rich.console import Console

from conftest import ORCH
from coordinator_calls import heartbeat
from orch.master.control.plan import RunPlan
from orch.master.coordinator import Coordinator
from orch.views.dashboard import Dashboard, SweepDashboard, show
from orch.views.rank_rows import MAX_TABLE_ROWS
from orch.views.rendering import render, render_sweep_plain, run_table, summary, sweep_table
from orch.views.run_html import header_html, progress_html, table_html
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.client import StateMirror
from orch.wire.states import RankState, RunState


def mirror_of(losses: dict[int, list[float]], rates: dict[int, int]) -> StateMirror:
    clock = [0.0]
    c = Coordinator(RunPlan(3), run_id="run-x", clock=lambda: clock[0])
    for i in range(3):
        c.register(pb.RegisterRequest(worker_id=f"w{i}", host=f"h{i}", pid=100 + i, rendezvous_port=1))
    for i in range(3):
        c.can_start(pb.CanStartTrainingRequest(run_id="run-x", worker_id=f"w{i}"))
    for t in range(3):
        clock[0] += 1.0
        for i in range(3):
            series = [pb.Series(name="loss", steps=[t], values=[losses[i][t]])] if i in losses else []
            # Rank 2 computes longest and so waits least in the collectives: the straggler.
            timing = pb.StepTiming(
                steps=10, step_seconds=1.0, collective_seconds=0.01 if i == 2 else 0.6, collectives=True
            )
            heartbeat(
                c,
                pb.HeartbeatRequest(
                    run_id="run-x", worker_id=f"w{i}", step=rates[i] * t, series=series, timing=timing
                ),
            )
        c.expire()  # a judgement a second: a straggler shows once two agree
    m = StateMirror()
    m.apply(c.snapshot())
    return m


def test_rows_mark_no_loss_yet_divergence_and_stragglers() -> None:
    m = mirror_of({0: [2.0, 1.5, 1.25], 1: [2.0, math.nan, math.nan]}, {0: 10, 1: 10, 2: 2})
    lines = render(m, address="127.0.0.1:1").splitlines()
    assert lines[0].startswith("orch run run-x  RUNNING") and "3/3 ranks" in lines[0]
    assert lines[3].split()[:3] == ["rank", "state", "step"]
    rows = dict(enumerate(lines[4:7]))
    assert "1.25 " in rows[0] and "<-" not in rows[0]  # four significant digits, not fixed decimals
    # Where the loss went NaN, and its last finite value.
    assert "nan" in rows[1] and "<- loss nan from step 1 (last finite 2 at step 0)" in rows[1]
    assert rows[2].split()[3] == "-" and "straggler: compute" in rows[2]  # no loss logged yet
    assert "straggler" not in rows[0] + rows[1]
    # Each rank's step split, in ms per step, and its compute against the fastest rank's.
    assert "0/40/60/0 x1.00" in rows[0] and "0/99/1/0 x2.47" in rows[2] and "h2/102" in rows[2]
    assert any(
        ln.startswith("stragglers: rank 2 is the straggler, slow in compute: 99.0 ms") for ln in lines
    ), lines


def test_summary_names_the_root_cause_with_its_traceback() -> None:
    m = mirror_of({0: [1.0, 1.0, 1.0]}, {0: 1, 1: 1, 2: 1})
    c = Coordinator(RunPlan(1), run_id="r")
    c.register(pb.RegisterRequest(worker_id="w", host="h", pid=7, rendezvous_port=1))
    c.can_start(pb.CanStartTrainingRequest(run_id="r", worker_id="w"))
    c.complete(
        pb.CompletionRequest(
            run_id="r",
            worker_id="w",
            outcome=pb.RANK_FAILED,
            error="Traceback (most recent call last):\nValueError: bad",
        )
    )
    m.apply(c.snapshot())
    text = summary(m)
    assert "FAILED" in text and "root cause: rank 0 (host h, pid 7) failed: ValueError: bad" in text
    assert "Traceback (most recent call last)" in text


def test_dropped_points_are_shown_in_the_dashboard_and_the_panel() -> None:
    m = mirror_of({0: [1.0, 1.0, 1.0]}, {0: 1, 1: 1, 2: 1})
    assert not any("dropped" in line for line in render(m).splitlines())
    c = Coordinator(RunPlan(1), run_id="d", clock=lambda: 0.0)
    c.register(pb.RegisterRequest(worker_id="w", host="h", pid=1, rendezvous_port=1))
    c.can_start(pb.CanStartTrainingRequest(run_id="d", worker_id="w"))
    why = "the master refused a heartbeat of 1,234 points: <a series> is bad"
    heartbeat(
        c, pb.HeartbeatRequest(run_id="d", worker_id="w", step=1, dropped_points=1234, dropped_reason=why)
    )
    m = StateMirror()
    m.apply(c.snapshot())
    assert m.ranks[0].dropped_points == 1234
    assert f"1,234 points dropped: {why}" in render(m).splitlines()[4]  # orch status, plain dashboard
    assert "1,234 points dropped: the master refused a heartbeat" in table_html(m)  # the panel
    assert "&lt;a series&gt; is bad" in table_html(m)


# -- the rich views -----------------------------------------------------------------------------
SGR = re.compile(r"\x1b\[[0-9;]*m")  # colours and weights: the only escapes a rendered view may hold


def rich_text(renderable: object, width: int = 160) -> str:
    """What a 16-colour terminal ``width`` columns wide would be sent."""
    out = io.StringIO()
    Console(file=out, force_terminal=True, width=width, color_system="standard").print(renderable)
    return out.getvalue()


def assert_only_colours(text: str) -> None:
    """No escape but colour changes, and no other control character than a newline."""
    bare = SGR.sub("", text)
    assert not any((ord(ch) < 0x20 and ch != "\n") or 0x7F <= ord(ch) <= 0x9F for ch in bare), repr(bare)


TRACEBACK = "Traceback (most recent call last):\nValueError: bad"


def failed_mirror(host: str = "h", error: str = TRACEBACK) -> StateMirror:
    c = Coordinator(RunPlan(2), run_id="r-f", clock=lambda: 5.0)
    for i in range(2):
        c.register(pb.RegisterRequest(worker_id=f"w{i}", host=host, pid=7 + i, rendezvous_port=1))
    for i in range(2):
        c.can_start(pb.CanStartTrainingRequest(run_id="r-f", worker_id=f"w{i}"))
    c.complete(pb.CompletionRequest(run_id="r-f", worker_id="w1", outcome=pb.RANK_FAILED, error=error))
    m = StateMirror()
    m.apply(c.snapshot())
    return m


def test_run_table_colours_the_states_and_marks_the_ranks() -> None:
    m = mirror_of({0: [2.0, 1.5, 1.25], 1: [2.0, math.nan, math.nan]}, {0: 10, 1: 10, 2: 2})
    text = rich_text(run_table(m, address="127.0.0.1:1"))
    assert_only_colours(text)
    plain = SGR.sub("", text)
    head, where = plain.splitlines()[:2]
    assert head.split()[:4] == ["orch", "run", "run-x", "RUNNING"]
    assert "attempt 1/1" in head and "3/3 ranks" in head and where == "master 127.0.0.1:1  rendezvous h0:1"
    assert "\x1b[1;36mRUNNING\x1b[0m" in text  # the run's state and each rank's, bold cyan
    assert "rank  state" in text and "steps/s" in text and "heartbeat" in text  # the header, unstyled
    rows = {line.split()[0]: line for line in plain.splitlines() if line[:4].strip().isdigit()}
    assert "1.25 " in rows["0"] and "h0/100" in rows["0"]
    assert "loss nan from step 1" in rows["1"] and "\x1b[1;31mloss nan from step 1" in text
    assert (
        "straggler: compute" in rows["2"] and "\x1b[1;33mstraggler: compute" in text and "h2/102" in rows["2"]
    )
    assert "█" in rows["2"] and "0/99/1/0 x2.47" in rows["2"]
    assert "stragglers: rank 2 is the straggler, slow in compute" in plain


def test_run_table_of_a_failed_run_names_the_root_cause_in_red() -> None:
    m = failed_mirror()
    assert m.state.value == "FAILED"
    text = rich_text(run_table(m))
    plain = SGR.sub("", text)
    assert "\x1b[1;31mFAILED\x1b[0m" in text
    assert "\x1b[1;31mroot cause: \x1b[0m" in text
    assert "root cause: rank 1 (host h, pid 8) failed: ValueError: bad" in plain
    assert "ValueError: bad" in plain.splitlines()[-1]  # the end of its traceback, below
    (row,) = [line for line in plain.splitlines() if line.startswith("   1 ")]
    assert "root cause" in row


HOSTILE_HOST = "[bold red]x\x1b]0;pwned\x07\u202e"
HOSTILE_ERROR = "Traceback:\n[link=https://evil.example]click[/link] \x1b[2J\x1b]8;;https://evil\x1b\\here"


def test_markup_and_escapes_from_workers_are_shown_literally() -> None:
    m = failed_mirror(host=HOSTILE_HOST, error=HOSTILE_ERROR)
    text = rich_text(run_table(m, address="127.0.0.1:1"))
    assert_only_colours(text)  # no OSC title or hyperlink, no screen clear: only our colours
    assert "pwned" not in text and "evil\x1b" not in text and "\u202e" not in text
    assert "[bold red]x\\u202e/7" in text and "[bold red]x\\u202e/8" in text
    assert "[link=https://evil.example]click[/link]" in text
    assert "\x1b[1;31mx" not in text  # the tag was not obeyed
    rows = [dict(sweep_row(0, "FAILED"), failure=HOSTILE_ERROR, config={"tag": "[blink]y"})]
    text = rich_text(sweep_table(rows))
    assert_only_colours(text)
    assert "[link=https://evil.example]click[/link]" in text and "[blink]y" in text
    plain = render_sweep_plain(rows)
    assert "\x1b" not in plain and "\x07" not in plain and "[blink]y" in plain


def test_plain_outputs_have_no_escape_codes() -> None:
    rows = [sweep_row(0, "SUCCEEDED", loss=0.5, best_run=True), sweep_row(1, "FAILED", failure="boom")]
    mirrors = [
        failed_mirror(host=HOSTILE_HOST, error=HOSTILE_ERROR),
        mirror_of({0: [1.0] * 3}, {0: 1, 1: 1, 2: 1}),
    ]
    for text in [render(m, address="a:1") for m in mirrors] + [summary(mirrors[0]), render_sweep_plain(rows)]:
        assert "\x1b" not in text and "\x07" not in text, repr(text)
    out = io.StringIO()  # not a terminal: a line now and then, and the plain table at the end
    calls = iter([False, False, True])
    SweepDashboard(lambda: rows, lambda: next(calls), out=out, interval=0, plain_every=0).run()
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("sweep: 1 FAILED, 1 SUCCEEDED; best #0 loss 0.5")
    assert lines[-2].split()[:2] == ["0", "SUCCEEDED"] and "\x1b" not in out.getvalue()


def sweep_row(index: int, state: str, *, loss: float | None = None, **more: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "index": index,
        "run_id": f"run{index}" if state != "PENDING" else "",
        "config": {"lr": 10.0**-index},
        "state": state,
        "step": 100 if state == "SUCCEEDED" else 10,
        "total": 100,
        "last": {} if loss is None else {"loss": loss},
        "best": {} if loss is None else {"loss": loss},
        "best_run": False,
        "failure": "",
    }
    row.update(more)
    return row


def test_sweep_table_marks_the_best_run_and_shows_failures() -> None:
    rows = [
        sweep_row(0, "SUCCEEDED", loss=0.25, best_run=True),
        sweep_row(1, "FAILED", failure="rank 1 (host h, pid 8) failed: ValueError: bad"),
        sweep_row(2, "RUNNING", loss=0.75),
        sweep_row(3, "PENDING"),
    ]
    text = rich_text(sweep_table(rows))
    plain = SGR.sub("", text)
    lines = {line.split()[0]: line for line in plain.splitlines() if line[:3].strip().isdigit()}
    assert "★ best" in lines["0"] and "0.25" in lines["0"] and "run0" in lines["0"] and "lr=1" in lines["0"]
    assert "★ best" not in lines["2"] and "0.75" in lines["2"] and "10/100" in lines["2"]
    assert "ValueError: bad" in lines["1"] and "\x1b[31mrank 1 (host h" in text
    assert "\x1b[1;31mFAILED" in text and "\x1b[1;32mSUCCEEDED" in text and "\x1b[1;36mRUNNING" in text
    assert "1 FAILED, 1 PENDING, 1 RUNNING, 1 SUCCEEDED" in plain.splitlines()[0]
    assert "last loss" in plain and "best loss" in plain
    text = render_sweep_plain(rows)
    lines = {line.split()[0]: line for line in text.splitlines()[2:]}
    assert lines["0"].endswith("lr=1  <- best")  # 4 significant digits, as every view writes it
    assert lines["1"].endswith("FAILED: rank 1 (host h, pid 8) failed: ValueError: bad")
    assert lines["3"].split()[:4] == ["3", "PENDING", "10/100", "-"]


# -- drawing on a terminal ----------------------------------------------------------------------
class TerminalIO(io.StringIO):
    """Output that says it is a terminal."""

    def isatty(self) -> bool:
        return True


FRAME_TOP = re.compile(r"\x1b\[(\d+)F\x1b\[J")


class StepClient:
    """A master client over a coordinator in this process that moves the run on at every poll."""

    address = "127.0.0.1:9"

    def __init__(self) -> None:
        self.clock = [0.0]
        self.c = Coordinator(RunPlan(2, total_steps=3), run_id="run-t", clock=lambda: self.clock[0])
        for i in range(2):
            self.c.register(pb.RegisterRequest(worker_id=f"w{i}", host=f"h{i}", pid=1 + i, rendezvous_port=1))
        for i in range(2):
            self.c.can_start(pb.CanStartTrainingRequest(run_id="run-t", worker_id=f"w{i}"))
        self.polls = 0

    def get_state(
        self, cursor: bytes = b"", *, skip_series: bool = False, changed_ranks: bool = False
    ) -> pb.GetStateResponse:
        self.polls += 1
        self.clock[0] += 1.0
        for i in range(2):
            if self.polls <= 3:
                heartbeat(self.c, pb.HeartbeatRequest(run_id="run-t", worker_id=f"w{i}", step=self.polls))
            else:
                self.c.complete(
                    pb.CompletionRequest(run_id="run-t", worker_id=f"w{i}", outcome=pb.RANK_SUCCEEDED, step=3)
                )
        return self.c.snapshot(cursor, skip_series=skip_series, changed_ranks=changed_ranks)


def test_dashboard_redraws_the_rich_table_in_place_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "160")  # rich's width where it finds no terminal size
    out = TerminalIO()
    mirror = Dashboard(cast(Any, StepClient()), out=out, interval=0).run()
    assert mirror.state.value == "SUCCEEDED"
    screen = out.getvalue()
    frames = FRAME_TOP.findall(screen)
    # four polls, four frames, and the last once more as the live view stops (uncropped): each
    # after the first goes back to the top of the one before
    assert len(frames) == 4, repr(screen)
    # as high as the frame before it: the run's last frame is a line shorter, with no straggler
    # note for a run that ended too short to be judged (each frame erases what is below it)
    assert frames[:3] == ["7"] * 3 and frames[3] == "6", frames
    assert screen.startswith("\x1b[?25l") and screen.endswith("\x1b[?25h")  # the cursor hidden, then back
    last = SGR.sub("", FRAME_TOP.split(screen)[-1])
    assert "run-t" in last and "SUCCEEDED" in last and "3/3 (100%)" in last and "master 127.0.0.1:9" in last
    assert "rank  state" in last and "h1/2" in last


def test_sweep_dashboard_redraws_until_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    states = iter(
        [
            [sweep_row(0, "RUNNING"), sweep_row(1, "PENDING")],
            [sweep_row(0, "SUCCEEDED", loss=0.5), sweep_row(1, "RUNNING")],
            [sweep_row(0, "SUCCEEDED", loss=0.5, best_run=True), sweep_row(1, "FAILED", failure="boom")],
        ]
    )
    done = iter([False, False, True])
    out = TerminalIO()
    rows = SweepDashboard(lambda: next(states), lambda: next(done), out=out, interval=0).run()
    assert [r["state"] for r in rows] == ["SUCCEEDED", "FAILED"]
    screen = out.getvalue()
    assert len(FRAME_TOP.findall(screen)) == 3 and screen.endswith("\x1b[?25h")  # 3 frames, the last again
    last = SGR.sub("", FRAME_TOP.split(screen)[-1])
    assert "★ best" in last and "boom" in last and "1 FAILED, 1 SUCCEEDED" in last


def test_show_prints_plain_text_to_a_pipe_and_the_rich_table_to_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    m = failed_mirror()
    pipe, tty = io.StringIO(), TerminalIO()
    show(m, address="a:1", out=pipe)
    show(m, address="a:1", out=tty)
    assert pipe.getvalue() == render(m, address="a:1") + "\n"
    assert "\x1b[" in tty.getvalue() and "rank  state" in tty.getvalue()
    monkeypatch.setenv("TERM", "dumb")  # a terminal that cannot move its cursor gets the plain text
    dumb = TerminalIO()
    show(m, address="a:1", out=dumb)
    assert dumb.getvalue() == pipe.getvalue()


@pytest.mark.timeout(240)
def test_orch_run_on_a_terminal_draws_the_table_and_stops_on_ctrl_c(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """Under a real pseudo-terminal: the rich table is drawn in place, Ctrl-C (SIGINT to the
    terminal's foreground group, as a keyboard sends it) stops the run gracefully, the cursor is
    shown again, and no process is left (the autouse fixture checks)."""
    env = {k: v for k, v in subprocess_env.items() if k != "NO_COLOR"}
    env["TERM"] = "xterm-256color"
    argv = [
        ORCH,
        "run",
        *("--workers", "2", "--steps", "100000", "--refresh", "0.2"),
        "--run-root",
        str(tmp_path),
    ]
    pid, fd = pty.fork()
    if pid == 0:  # the child: `orch run` on a pseudo-terminal
        os.chdir(tmp_path)
        os.execve(ORCH, argv, env)
    screen, interrupted = "", False
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline:
            if not interrupted and re.search(r"RUNNING\S*  attempt", screen) and "heartbeat" in screen:
                # a frame of the running run is on the screen: press Ctrl-C
                os.write(fd, b"\x03")
                interrupted = True
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            screen += data.decode(errors="replace")
    finally:
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert interrupted, screen[-3000:]
    assert os.waitstatus_to_exitcode(status) == 3, screen[-3000:]
    assert len(FRAME_TOP.findall(screen)) >= 2, screen[-3000:]
    assert "rank  state" in screen and "\x1b[1;36mRUNNING" in screen
    assert "STOPPED" in screen
    assert screen.rfind("\x1b[?25h") > screen.rfind("\x1b[?25l") >= 0  # the cursor is back


def test_a_run_that_stands_still_says_so_with_the_stacks_in_every_view() -> None:
    """A coordinator whose ranks stopped stepping (hang_timeout 5 s on its own clock): the
    dashboard, orch status's plain text and the panel's HTML say "no progress", mark the
    standing ranks, and show the grouped stacks the ranks sent."""
    clock = [0.0]
    c = Coordinator(RunPlan(2, hang_timeout=5.0), run_id="run-h", clock=lambda: clock[0])
    for i in range(2):
        c.register(pb.RegisterRequest(worker_id=f"w{i}", host=f"h{i}", pid=100 + i, rendezvous_port=1))
    for i in range(2):
        c.can_start(pb.CanStartTrainingRequest(run_id="run-h", worker_id=f"w{i}"))
    for step in range(1, 6):
        clock[0] += 1.0
        for i in range(2):
            heartbeat(c, pb.HeartbeatRequest(run_id="run-h", worker_id=f"w{i}", step=step))
    clock[0] += 7.0
    for i in range(2):  # they beat on, their steps stand still
        heartbeat(c, pb.HeartbeatRequest(run_id="run-h", worker_id=f"w{i}", step=5))
    c.expire()
    assert c.ranks[0].stack_wanted  # asked for in the next reply
    for i, line in ((0, "dist.all_reduce(t)"), (1, "time.sleep(10**6)")):
        frame = pb.Frame(file="Cell In[3]", line=10 + i, function="train", code=line, user=True)
        heartbeat(
            c, pb.HeartbeatRequest(run_id="run-h", worker_id=f"w{i}", step=5, stack=pb.Stack(frames=[frame]))
        )
    c.expire()
    m = StateMirror()
    m.apply(c.snapshot())
    assert m.stalled_for == pytest.approx(7.0)
    plain = render(m)
    assert "progress: no progress for 7s: ranks 0, 1 at step 5 (limit 5s: hang_timeout=5s)" in plain
    assert plain.count("no step for 7s") == 2
    assert "rank 1: in `time.sleep(10**6)` (Cell In[3], line 11)" in plain
    assert "stragglers: stragglers are not judged while the ranks do not progress" in plain
    rich = SGR.sub("", rich_text(run_table(m)))
    assert (
        "progress: no progress for 7s" in rich
        and "rank 0: in `dist.all_reduce(t)` (Cell In[3], line 10)" in rich
    )
    assert rich.count("no step for 7s") == 2
    page = progress_html(m) + table_html(m)
    assert "no progress for 7s" in page and 'class="orch-stacks"' in page and "time.sleep(10**6)" in page


def test_the_start_up_note_is_in_every_view_and_a_plain_dashboard_writes_each_once() -> None:
    clock = [0.0]
    c = Coordinator(RunPlan(2), run_id="run-s", clock=lambda: clock[0])
    c.starting("starting 2 workers: importing torch")
    clock[0] = 6.0
    m = StateMirror()
    m.apply(c.snapshot())
    assert (m.startup_note, m.startup_seconds) == ("starting 2 workers: importing torch", 6.0)
    # Its seconds are the run's one clock, counted from the launch: in the header, once.
    assert "elapsed    6.0s" in render(m) and "starting: starting 2 workers: importing torch\n" in render(m)
    assert "starting: starting 2 workers: importing torch" in SGR.sub("", rich_text(run_table(m)))
    assert 'class="orch-startup"' in header_html(m) and "importing torch</div>" in header_html(m)
    assert '<span class="orch-elapsed">6.0s</span>' in header_html(m) and "(6 s)" not in header_html(m)

    class Client:
        """A master seen through a plain dashboard: each poll, a second later."""

        address = "127.0.0.1:9"

        def get_state(self, cursor: bytes = b"", **_: Any) -> pb.GetStateResponse:
            clock[0] += 1.0
            if clock[0] == 9.0:
                c.register(pb.RegisterRequest(worker_id="w0", host="h", pid=1))
            if clock[0] == 11.0:
                c.close_run("ended by the test")
            return c.snapshot(cursor)

    out = io.StringIO()
    Dashboard(cast(Any, Client()), out=out, interval=0, plain_every=0).run()
    lines = [line for line in out.getvalue().splitlines() if "starting: " in line]
    assert lines == [
        "[   7.0s] starting: starting 2 workers: importing torch",
        "[   9.0s] starting: 1/2 registered",
    ], out.getvalue()
    assert "PENDING step" not in out.getvalue()  # no line that only says it is PENDING meanwhile


def test_with_no_known_total_the_dashboard_shows_a_spinner_and_a_count_never_a_bar() -> None:
    from rich.progress_bar import ProgressBar
    from rich.spinner import Spinner

    m = mirror_of({0: [1.0, 1.0, 1.0]}, {0: 5, 1: 5, 2: 5})
    assert m.total_steps == 0 and m.state.value == "RUNNING"
    parts = cast(Any, run_table(m)).renderables
    assert isinstance(parts[1], Spinner) and not any(isinstance(p, ProgressBar) for p in parts)
    console = Console(width=120, record=True)
    console.print(parts[1])
    assert console.export_text().strip()[2:] == "step 10"
    assert render(m).splitlines()[1] == "step 10"  # the plain view: a count, no bar of dots


def test_a_stopping_run_says_how_long_each_kind_of_loop_takes_to_stop() -> None:
    from orch.wire.states import RunState as S

    m = StateMirror(run_id="r", state=S.STOPPING)
    note = progress_html(m)
    assert 'class="orch-stopping"' in note and "only calls <code>ctx.log</code> ends about 2 s" in note
    assert "orch-stopping" not in progress_html(StateMirror(run_id="r", state=S.RUNNING))


def test_a_big_runs_rank_table_shows_the_ranks_with_marks_first_and_counts_the_rest() -> None:
    from orch.wire.ranks import RankView

    n = 4 * MAX_TABLE_ROWS
    m = StateMirror(run_id="big", state=RunState.RUNNING, world_size=n)
    m.ranks = [RankView(rank=i, state=RankState.RUNNING, step=10, heartbeat_age=0.1) for i in range(n)]
    m.ranks[200].memory_note = "memory grows 40 MB/min"
    m.ranks[250].state, m.ranks[250].error = RankState.FAILED, "ValueError: bad"
    page = table_html(m)
    rows = re.findall(r'<tr class="orch-rank" data-rank="(\d+)"', page)
    assert len(rows) == MAX_TABLE_ROWS
    assert {"200", "250"} <= set(rows)  # the ranks with something to say, however far down
    assert rows == sorted(rows, key=int) and rows[:3] == ["0", "1", "2"]
    assert f"and {n - MAX_TABLE_ROWS:,} more ranks: {n - MAX_TABLE_ROWS:,} RUNNING" in page
    few = StateMirror(run_id="small", state=RunState.RUNNING)
    few.ranks = m.ranks[:MAX_TABLE_ROWS]
    assert "more ranks" not in table_html(few)
    assert len(re.findall(r'class="orch-rank"', table_html(few))) == MAX_TABLE_ROWS
