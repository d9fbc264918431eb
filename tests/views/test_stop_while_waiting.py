"""A click on the panel's Stop sent to the kernel's main shell, as a frontend without subshells
sends it (classic Notebook, VS Code, JupyterLab with subshells off), while a cell blocks in
``run.wait()``: the wait handles it, and what else came meanwhile runs afterwards, in order.

A real kernel started by jupyter_client, a real run of two workers; the test is the frontend.
"""

from __future__ import annotations

import queue
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import TESTS, notebook_kernel

pytestmark = pytest.mark.timeout(300)

LAUNCH = """\
import sys
sys.path.insert(0, {tests!r})
import orch
from orch.views.waiting import wait_for
run = orch.launch("jobs:allreduce_steps", world_size=2, config={{"steps": 100000, "sleep": 0.05}},
                  run_root={run_root!r})
panel = run.panel(interval=0.3)
assert wait_for(lambda: run.state().state.value == "RUNNING", 120), run.state().state
print(panel.stop_button.comm.comm_id)
"""


class Printed:
    """What each cell printed, by its request's id, read off IOPub as it comes."""

    def __init__(self, kc: Any) -> None:
        self.kc = kc
        self.text: dict[str, str] = {}

    def wait(self, parent: str, until: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while until not in self.text.get(parent, ""):
            left = deadline - time.monotonic()
            assert left > 0, f"no {until!r} within {timeout}s; the cells printed {self.text!r}"
            try:
                msg = self.kc.get_iopub_msg(timeout=left)
            except queue.Empty:
                continue
            if msg["msg_type"] == "stream":
                key = msg["parent_header"].get("msg_id", "")
                self.text[key] = self.text.get(key, "") + msg["content"]["text"]
        return self.text[parent]


def _comm_msg(kc: Any, comm_id: str, data: dict[str, Any]) -> None:
    """A widget message on the shell channel, with no subshell: the main shell gets it."""
    kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": comm_id, "data": data}))


def test_stop_clicked_on_the_main_shell_ends_a_blocked_wait_and_the_queued_cell_runs_after(
    tmp_path: Path,
) -> None:
    with notebook_kernel(tmp_path) as (_, kc):
        out: list[str] = []
        reply = kc.execute_interactive(
            LAUNCH.format(tests=str(TESTS), run_root=str(tmp_path / "runs")),
            timeout=180,
            output_hook=lambda m: out.append(m["content"].get("text", "")),
        )
        assert reply["content"]["status"] == "ok", (reply["content"], out)
        comm_id = "".join(out).split()[-1]
        try:
            waiting = kc.execute(
                'print("WAITING", flush=True)\nr = run.wait()\nprint("WAITED", r.state.value)'
            )
            printed = Printed(kc)
            printed.wait(waiting, "WAITING", 60)
            time.sleep(1.0)  # the cell is in wait() now: what follows reaches a busy main shell
            # A widget's new state: handled while the cell waits (a control the user changed).
            _comm_msg(kc, comm_id, {"method": "update", "state": {"tooltip": "set while waiting"}})
            queued = kc.execute('print("NEXT", run.state().state.value, panel.stop_button.tooltip)')
            info = kc.kernel_info()
            with pytest.raises(queue.Empty):  # all of it waits: nothing is answered ahead of the cell
                kc.get_shell_msg(timeout=1.0)
            _comm_msg(kc, comm_id, {"method": "custom", "content": {"event": "click"}})

            assert "WAITED STOPPED" in printed.wait(waiting, "WAITED", 60)
            replies = [kc.get_shell_msg(timeout=60) for _ in range(3)]
            order = [(r["parent_header"]["msg_id"], r["msg_type"]) for r in replies]
            assert order == [
                (waiting, "execute_reply"),
                (queued, "execute_reply"),
                (info, "kernel_info_reply"),
            ], order
            assert [r["content"]["status"] for r in replies] == ["ok"] * 3, replies
            assert replies[1]["content"]["execution_count"] == replies[0]["content"]["execution_count"] + 1
            assert "NEXT STOPPED set while waiting" in printed.wait(queued, "NEXT", 30)
        finally:
            kc.execute_interactive("run.close()", timeout=60)


def test_interrupting_a_wait_that_kept_messages_leaves_the_kernel_as_an_error_would(tmp_path: Path) -> None:
    # Interrupt instead of Stop: the cell fails, the one queued behind it is aborted (as after
    # any error), and the kernel takes the next request as usual; the run goes on.
    with notebook_kernel(tmp_path) as (km, kc):
        out: list[str] = []
        reply = kc.execute_interactive(
            LAUNCH.format(tests=str(TESTS), run_root=str(tmp_path / "runs")),
            timeout=180,
            output_hook=lambda m: out.append(m["content"].get("text", "")),
        )
        assert reply["content"]["status"] == "ok", (reply["content"], out)
        try:
            printed = Printed(kc)
            waiting = kc.execute('print("WAITING", flush=True)\nrun.wait()')
            printed.wait(waiting, "WAITING", 60)
            time.sleep(1.0)
            queued = kc.execute('print("QUEUED")')
            time.sleep(1.0)
            km.interrupt_kernel()
            replies = [kc.get_shell_msg(timeout=60) for _ in range(2)]
            assert [r["parent_header"]["msg_id"] for r in replies] == [waiting, queued]
            assert replies[0]["content"]["status"] == "error", replies[0]["content"]
            assert replies[0]["content"]["ename"] == "KeyboardInterrupt"
            assert "still RUNNING" in replies[0]["content"]["evalue"], replies[0]["content"]["evalue"]
            assert replies[1]["content"]["status"] == "aborted", replies[1]["content"]
            after = kc.execute('print("AFTER", run.state().state.value)')
            assert kc.get_shell_msg(timeout=60)["content"]["status"] == "ok"
            assert "AFTER RUNNING" in printed.wait(after, "AFTER", 30)
        finally:
            kc.execute_interactive("run.close()", timeout=60)


SWEEP = """\
import sys
sys.path.insert(0, {tests!r})
import orch
from orch.views.waiting import wait_for
configs = [{{"lr": 0.01, "steps": 100000, "sleep": 0.05}}, {{"lr": 0.1, "steps": 100000, "sleep": 0.05}}]
sweep = orch.sweep("jobs:lr_job", configs, world_size=1, run_root={run_root!r})
panel = sweep.panel(interval=0.3)
first = sweep.trials[0]
assert wait_for(lambda: first.run is not None and first.run.state().state.value == "RUNNING", 120)
print(panel.stop_button.comm.comm_id)
"""


def test_stop_all_clicked_on_the_main_shell_ends_a_blocked_sweep_wait(tmp_path: Path) -> None:
    with notebook_kernel(tmp_path) as (_, kc):
        out: list[str] = []
        reply = kc.execute_interactive(
            SWEEP.format(tests=str(TESTS), run_root=str(tmp_path / "runs")),
            timeout=180,
            output_hook=lambda m: out.append(m["content"].get("text", "")),
        )
        assert reply["content"]["status"] == "ok", (reply["content"], out)
        comm_id = "".join(out).split()[-1]
        try:
            printed = Printed(kc)
            waiting = kc.execute(
                'print("WAITING", flush=True)\nr = sweep.wait()\nprint("SWEPT", [row["state"] for row in r])'
            )
            printed.wait(waiting, "WAITING", 60)
            time.sleep(1.0)
            queued = kc.execute('print("NEXT")')
            _comm_msg(kc, comm_id, {"method": "custom", "content": {"event": "click"}})
            # the running config stopped, the queued one never started
            assert "SWEPT ['STOPPED', 'CANCELLED']" in printed.wait(waiting, "SWEPT", 90)
            replies = [kc.get_shell_msg(timeout=60) for _ in range(2)]
            assert [r["parent_header"]["msg_id"] for r in replies] == [waiting, queued]
            assert [r["content"]["status"] for r in replies] == ["ok", "ok"], replies
            assert "NEXT" in printed.wait(queued, "NEXT", 30)
        finally:
            kc.execute_interactive("sweep.close()", timeout=60)


WAIT = 'print("WAITING", flush=True)\nr = run.wait()\nprint("WAITED", r.state.value)'
CONTROLS = """\
# The list offers the code's loss before it logged one: wait for its points (and the list they settle).
assert wait_for(lambda: any(n == "loss" and len(b) for (_, n), b in panel.mirror.series.items()), 60)
assert wait_for(lambda: {"loss", "rank/memory"} <= set(panel.metric.options), 60), panel.metric.options
print(" ".join(w.comm.comm_id for w in (panel.stop_button, panel.log_scale, panel.metric, panel.plot)),
      panel.metric.options.index("rank/memory"))
"""


def test_controls_changed_on_the_main_shell_are_drawn_while_the_wait_blocks(tmp_path: Path) -> None:
    """The log scale ticked and another metric chosen while a cell waits, sent to the main
    shell as a frontend without subshells sends them: the panel draws each while the cell
    still waits (the plot's classes say what it draws), not when the wait returns."""
    with notebook_kernel(tmp_path) as (_, kc):
        out: list[str] = []
        for code in (LAUNCH.format(tests=str(TESTS), run_root=str(tmp_path / "runs")), CONTROLS):
            reply = kc.execute_interactive(
                code, timeout=180, output_hook=lambda m: out.append(m["content"].get("text", ""))
            )
            assert reply["content"]["status"] == "ok", (reply["content"], out)
        stop, log_scale, metric, plot, memory = "".join(out).split()[-5:]
        try:
            waiting = kc.execute(WAIT)
            Printed(kc).wait(waiting, "WAITING", 60)
            time.sleep(1.0)  # the cell is in wait() now
            took = []
            for comm_id, state, drawn in (
                (log_scale, {"value": True}, ["orch-plot", "orch-metric-loss", "orch-log"]),
                # as a page sends it
                (metric, {"index": int(memory)}, ["orch-plot", "orch-metric-rank/memory", "orch-log"]),
            ):
                sent = time.monotonic()
                _comm_msg(kc, comm_id, {"method": "update", "state": state, "buffer_paths": []})
                classes: list[str] = []
                while classes != drawn:
                    left = sent + 30 - time.monotonic()
                    assert left > 0, f"the panel did not draw {drawn!r} while the cell waited"
                    msg = kc.get_iopub_msg(timeout=left)
                    content = msg["content"]
                    assert "WAITED" not in str(content.get("text", "")), "the wait returned first"
                    if msg["msg_type"] == "comm_msg" and content.get("comm_id") == plot:
                        classes = content["data"].get("state", {}).get("_dom_classes", classes)
                took.append(time.monotonic() - sent)
            print(f"\ncontrols drawn while a cell waited (main shell): {took[0]:.2f}s, {took[1]:.2f}s")
            _comm_msg(kc, stop, {"method": "custom", "content": {"event": "click"}})
            assert "WAITED STOPPED" in Printed(kc).wait(waiting, "WAITED", 60)
        finally:
            kc.execute_interactive("run.close()", timeout=60)
