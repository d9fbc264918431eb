"""The notebook panel through its synced widget state, on real runs with real workers."""

from __future__ import annotations

import base64
import math
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

import orch
from conftest import TESTS, images_sent, notebook_kernel
from coordinator_calls import heartbeat
from orch.master.control.plan import RunPlan
from orch.master.coordinator import Coordinator
from orch.master.server import MasterServer
from orch.views._static import WIDGET_VIEW
from orch.views.panel import Panel
from orch.views.rank_plot import downsample
from orch.views.waiting import wait_for
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire._proto import orchestrator_pb2_grpc as pb_grpc
from orch.wire.client import StateMirror
from orch.wire.states import RunState

pytestmark = pytest.mark.timeout(180)
sys.path.insert(0, str(TESTS))


def updates_to(sent: list[tuple[str, dict[str, Any]]], widget: Any, trait: str) -> list[Any]:
    """Values of ``trait`` that were synced to the front end for ``widget``."""
    out = []
    for comm_id, msg in list(sent):
        state = msg["data"].get("state", {})
        if comm_id == widget.comm.comm_id and msg["data"].get("method") == "update" and trait in state:
            out.append(state[trait])
    return out


def record_of(panel: Panel) -> tuple[str, bytes, str]:
    """The static record the panel's output was replaced with: its HTML, PNG and text."""
    bundle = panel._repr_mimebundle_()
    assert panel.record.published and WIDGET_VIEW not in bundle, sorted(bundle)
    png = base64.b64decode(bundle["image/png"])
    assert png.startswith(b"\x89PNG\r\n") and bundle["image/png"] in bundle["text/html"]
    return bundle["text/html"], png, bundle["text/plain"]


def test_downsample_keeps_spikes_and_the_newest_point() -> None:
    n = 1_000_003
    x = np.arange(n)
    y = np.ones(n)
    y[123_457] = 50.0
    y[777_777] = math.nan
    xs, ys = downsample(x, y, 500)
    assert len(xs) <= 2 * 500 + 2 * (n // 500)
    assert len(xs) < 3000
    assert 50.0 in ys and xs[-1] == n - 1
    assert np.all(np.diff(xs) >= 0)
    small_x, _ = downsample(x[:100], y[:100], 500)
    assert len(small_x) == 100


def test_panel_follows_a_real_run_live(tmp_path: Path, widget_messages: list[Any]) -> None:
    steps = 60
    # 6 s of training at least: the panel (0.1 s interval) polls it many times over, also when
    # it gets little of a loaded 2-core machine's time.
    with orch.launch(
        "jobs:allreduce_steps", world_size=4, config={"steps": steps, "sleep": 0.1}, run_root=str(tmp_path)
    ) as run:
        panel = run.panel(interval=0.1)
        assert WIDGET_VIEW in panel._repr_mimebundle_()  # the live widget while the run runs
        run.wait(timeout=120)
        assert panel.wait_done(30)
        # the output became the record of the final state, curves included
        page, _png, text = record_of(panel)
        assert 'data-state="SUCCEEDED"' in page and page.count('class="orch-rank"') == 4
        assert page.index('data-state="SUCCEEDED"') < page.index("<img ") < page.index("orch-ranks")
        assert f"step {steps}/{steps}" in page and "attempt 1/1" in page
        assert text.startswith(f"run {run.run_id} SUCCEEDED") and "orch-failure" not in page
        # the final state stays drawn
        assert 'data-state="SUCCEEDED"' in panel.header.value
        assert panel.table.value.count('class="orch-rank"') == 4
        assert (panel.progress.value, panel.progress.max) == (steps, steps)
        assert panel.stop_button.disabled
        assert sorted(panel._plot.lines) == [0, 1, 2, 3]
        for rank, line in panel._plot.lines.items():
            assert len(line.get_xdata()) == steps, rank
        # what the job logged, and each rank's memory (orch's own metric) once a beat carried it
        assert [o for o in panel.metric.options if o != "rank/memory"] == ["loss", "rank_seen"]
        assert "process group up" in panel.log_tail.value
        # the updates reached the front end while the run was still going, not only at the end
        headers = updates_to(widget_messages, panel.header, "value")
        assert any('data-state="RUNNING"' in h for h in headers)
        assert images_sent(widget_messages, panel.plot) >= 3
        # redrawn while it ran; that a poll without new points does not redraw is counted in
        # test_a_poll_without_new_points_does_not_redraw_the_plot (the count here depends on timing)
        assert panel.polls > 3 and panel.redraws > 1
        progress = updates_to(widget_messages, panel.progress, "value")
        assert progress == sorted(progress) and 0 < progress[0] < steps
        # changing the metric redraws it
        panel.metric.value = "rank_seen"
        assert panel._plot.metric == "rank_seen"
        assert [line.get_ydata()[-1] for _, line in sorted(panel._plot.lines.items())] == [0, 1, 2, 3]


def test_stop_button_stops_a_real_run(tmp_path: Path, widget_messages: list[Any]) -> None:
    with orch.launch(
        "jobs:allreduce_steps", world_size=4, config={"steps": 100_000, "sleep": 0.02}, run_root=str(tmp_path)
    ) as run:
        panel = run.panel(interval=0.1)
        assert wait_for(
            lambda: (
                panel.mirror.state is RunState.RUNNING
                and min((r.step for r in panel.mirror.ranks), default=0) > 5
            ),
            60,
        )
        assert not panel.stop_button.disabled
        panel.stop_button.click()
        result = run.wait(timeout=60)
        assert result.state is RunState.STOPPED
        assert {r.state.value for r in run.state().ranks} == {"STOPPED"}
        assert len(set(result.steps)) == 1 and 5 < result.steps[0] < 100_000  # all stopped together
        assert panel.wait_done(30)
        assert 'data-state="STOPPED"' in panel.header.value


def test_panel_names_the_root_cause_of_a_failure(tmp_path: Path, widget_messages: list[Any]) -> None:
    run = orch.launch("jobs:raise_on_rank1", world_size=2, run_root=str(tmp_path))
    try:
        panel = run.panel(interval=0.1)
        with pytest.raises(orch.RunFailed) as e:
            run.wait(timeout=120)
        assert e.value.rank == 1 and "boom on rank 1" in e.value.traceback
        assert panel.wait_done(30)
        assert 'data-state="FAILED"' in panel.header.value
        assert "RuntimeError: boom on rank 1" in panel.failure.value
        assert "jobs.py" in panel.failure.value  # the traceback, not only its last line
        page, _png, text = record_of(panel)
        assert 'data-state="FAILED"' in page and "orch-failure" in page
        assert "RuntimeError: boom on rank 1" in page and "jobs.py" in page
        assert "root cause: rank 1" in text and "RuntimeError: boom on rank 1" in text
        # Only rank 1 reads FAILED; rank 0, torn down because of it, says so.
        states = {r.rank: r.state.value for r in panel.mirror.ranks}
        assert states == {0: "STOPPED", 1: "FAILED"}, states
        assert '<span class="orch-stopped-by">stopped: rank 1 failed</span>' in panel.table.value
        assert "rank 1 (host " in str(e.value) and "worker" not in str(e.value).split(":")[0]
    finally:
        run.close()


def test_a_run_that_logged_no_points_says_so_instead_of_empty_axes(
    tmp_path: Path, widget_messages: list[Any]
) -> None:
    run = orch.launch("jobs:fails_at_startup", world_size=1, run_root=str(tmp_path))
    try:
        panel = run.panel(interval=0.1)
        with pytest.raises(orch.RunFailed):
            run.wait(timeout=120)
        assert panel.wait_done(30)
        assert [t.get_text() for t in panel._plot.ax.texts] == ["no points were logged"]
        # in a line in the plot's place, and in the record: no empty axes
        assert panel.plot.layout.display == "none" and "no points were logged" in panel.no_points.value
        assert "<img" not in panel._repr_mimebundle_()["text/html"]
        record = orch.load_run(run.run_dir).panel()  # the run read back from disk says the same
        assert [t.get_text() for t in record._plot.ax.texts] == ["no points were logged"]
        assert record.plot.layout.display == "none"
        record.close()
        panel.close()
    finally:
        run.close()


def test_a_record_replaces_its_output_from_any_thread(tmp_path: Path) -> None:
    """In a real kernel: the live widget is shown with a display id; publish() from a thread
    of the user's while a cell runs updates it, with that cell as its parent (the messages
    that nbclient records are those of the cell it executes, and JupyterLab goes by the id)."""
    with notebook_kernel(tmp_path) as (_km, kc):

        def cell(code: str) -> list[dict[str, Any]]:
            seen: list[dict[str, Any]] = []  # the messages whose parent is this cell
            reply = kc.execute_interactive(code, timeout=60, output_hook=seen.append)
            assert reply["content"]["status"] == "ok", reply["content"]
            return [m for m in seen if m["msg_type"] in ("display_data", "update_display_data")]

        cell(
            "import threading\nimport ipywidgets\nfrom orch.views._static import IMAGE, Record\n"
            "record = Record(ipywidgets.HTML('live'), text='a live view')"
        )
        [shown] = cell("record")
        display_id = shown["content"]["transient"]["display_id"]
        assert shown["msg_type"] == "display_data" and WIDGET_VIEW in shown["content"]["data"]
        assert shown["content"]["data"]["text/plain"] == "a live view"
        [update] = cell(
            "publish = lambda: record.publish(b'png!', '<b>head</b>' + IMAGE + '<table></table>', 'done')\n"
            "thread = threading.Thread(target=publish)\nthread.start()\nthread.join()"
        )
        assert update["msg_type"] == "update_display_data"
        assert update["content"]["transient"]["display_id"] == display_id
        data = update["content"]["data"]
        assert sorted(data) == ["image/png", "text/html", "text/plain"]
        assert data["image/png"] == base64.b64encode(b"png!").decode()
        assert f'<b>head</b><img src="data:image/png;base64,{data["image/png"]}"' in data["text/html"]
        assert data["text/html"].endswith("<table></table></div>") and data["text/plain"] == "done"
        [again] = cell("record")  # shown once it ended: the record alone
        assert again["content"]["data"] == data and again["content"]["transient"]["display_id"] == display_id


class _Source:
    """A panel source for a master served by the test itself."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.stopped = False

    def stop(self, reason: str = "") -> RunState:
        self.stopped = True
        return RunState.RUNNING

    def log_files(self) -> dict[str, Path]:
        return {}

    def final_state(self) -> StateMirror | None:
        return None

    def connect(self) -> orch.MasterClient:
        return orch.MasterClient(self.address)


def test_table_marks_nan_losses_and_stragglers(widget_messages: list[Any]) -> None:
    clock = [100.0]
    coord = Coordinator(RunPlan(3), run_id="r", clock=lambda: clock[0])
    for i in range(3):
        coord.register(pb.RegisterRequest(worker_id=f"w{i}", host="h", pid=i, rendezvous_port=29400))
    for i in range(3):
        coord.can_start(pb.CanStartTrainingRequest(run_id="r", worker_id=f"w{i}"))
    for t in range(3):
        for i, rate in enumerate((10, 10, 2)):
            loss = [math.nan] if i == 1 else [1.0]
            # Rank 2 computes longest and waits least in the collectives: the straggler.
            wait = 0.01 if i == 2 else 0.6
            timing = pb.StepTiming(steps=10, step_seconds=1.0, collective_seconds=wait, collectives=True)
            heartbeat(
                coord,
                pb.HeartbeatRequest(
                    run_id="r",
                    worker_id=f"w{i}",
                    step=rate * t,
                    series=[pb.Series(name="loss", steps=[rate * t], values=loss)],
                    timing=timing,
                ),
            )
        coord.expire()  # a judgement a second: a straggler shows once two agree
        clock[0] += 1.0
    with MasterServer(coord, port=0) as server:
        panel = Panel(_Source(server.address), interval=0.05)
        try:
            assert wait_for(lambda: panel.polls >= 2, 60)
            rows = panel.table.value.split('<tr class="orch-rank"')[1:]
            assert "loss nan from step 0" in rows[1] and "orch-nan" not in rows[0]
            assert "straggler" in rows[2] and "straggler" not in rows[0]
            panel.stop_button.click()
            assert panel.source.stopped  # type: ignore[attr-defined]
        finally:
            panel.close()


def test_with_no_known_total_the_progress_is_a_turning_count_never_a_full_bar(
    widget_messages: list[Any],
) -> None:
    coord = Coordinator(RunPlan(1), run_id="r", clock=lambda: 100.0)  # a still clock: no heartbeat expires
    coord.register(pb.RegisterRequest(worker_id="w", host="h", pid=1, rendezvous_port=29400))
    coord.can_start(pb.CanStartTrainingRequest(run_id="r", worker_id="w"))
    heartbeat(coord, pb.HeartbeatRequest(run_id="r", worker_id="w", step=37))  # no total_steps
    with MasterServer(coord, port=0) as server:
        panel = Panel(_Source(server.address), interval=0.05)
        try:
            assert wait_for(lambda: panel.polls >= 3, 60)
            assert panel.progress.layout.visibility == "hidden"  # no bar, so none reads full
            assert panel.progress.value == 0
            labels = set()
            for _ in range(3):
                polls = panel.polls
                assert wait_for(lambda p=polls: panel.polls > p + 1, 60)
                label = panel.progress_label.value
                assert label[0] in "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏" and label[2:] == "step 37 (total unknown)", label
                labels.add(label)
            assert len(labels) > 1  # it turns while the run goes
            # a total told later: a bar of it
            heartbeat(coord, pb.HeartbeatRequest(run_id="r", worker_id="w", step=40, total_steps=160))
            assert wait_for(lambda: panel.progress_label.value == "step 40/160 (25%)", 60)
            assert panel.progress.layout.visibility == "visible"
            assert (panel.progress.value, panel.progress.max) == (40, 160)
        finally:
            panel.close()


def test_a_poll_without_new_points_does_not_redraw_the_plot(widget_messages: list[Any]) -> None:
    """Counted in polls, not in time: the time a redraw takes is benchmarks/panel_redraw.py's."""
    coord = Coordinator(RunPlan(1), run_id="r", clock=lambda: 100.0)  # a still clock: no heartbeat expires
    coord.register(pb.RegisterRequest(worker_id="w", host="h", pid=1, rendezvous_port=29400))
    coord.can_start(pb.CanStartTrainingRequest(run_id="r", worker_id="w"))

    def heartbeat(stub: pb_grpc.OrchestratorStub, steps: list[int]) -> None:
        loss = pb.Series(name="loss", steps=steps, values=[1.0 / (s + 1) for s in steps])
        request = pb.HeartbeatRequest(run_id="r", worker_id="w", step=steps[-1], series=[loss])
        stub.SendHeartbeat(request, timeout=60)

    def pngs() -> int:
        return images_sent(widget_messages, panel.plot)

    def after_polls(n: int) -> None:
        # Poll k + 1 starts after poll k's redraw ended: n + 1 more polls, n more redraws done.
        polls = panel.polls
        assert wait_for(lambda: panel.polls >= polls + n + 1, 60), (polls, panel.polls)

    with MasterServer(coord, port=0) as server, grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.OrchestratorStub(channel)
        heartbeat(stub, [0, 1, 2])
        panel = Panel(_Source(server.address), interval=0.05)
        try:
            after_polls(1)  # the first poll brought the points and drew them
            assert len(panel._plot.lines[0].get_xdata()) == 3
            redraws, images = panel.redraws, pngs()
            assert redraws >= 1 and images >= 1
            after_polls(3)
            assert (panel.redraws, pngs()) == (redraws, images), "redrawn with no new point"
            heartbeat(stub, [3])
            assert wait_for(lambda: panel.redraws > redraws, 60)
            after_polls(3)
            assert (panel.redraws, pngs()) == (redraws + 1, images + 1), "one new point, one redraw"
            assert len(panel._plot.lines[0].get_xdata()) == 4
        finally:
            panel.close()


def test_a_new_metric_does_not_flash_in_place_of_the_one_shown(widget_messages: list[Any]) -> None:
    """ "accuracy" sorts before "loss": new choices must not draw it for a moment."""
    coord = Coordinator(RunPlan(1), run_id="r", clock=lambda: 100.0)
    coord.register(pb.RegisterRequest(worker_id="w", host="h", pid=1, rendezvous_port=29400))
    coord.can_start(pb.CanStartTrainingRequest(run_id="r", worker_id="w"))

    def heartbeat(stub: pb_grpc.OrchestratorStub, step: int, **metrics: float) -> None:
        series = [pb.Series(name=k, steps=[step], values=[v]) for k, v in metrics.items()]
        stub.SendHeartbeat(
            pb.HeartbeatRequest(run_id="r", worker_id="w", step=step, series=series), timeout=60
        )

    with MasterServer(coord, port=0) as server, grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.OrchestratorStub(channel)
        heartbeat(stub, 0, loss=1.0)
        panel = Panel(_Source(server.address), interval=0.05)
        drawn: list[str] = []
        draw = panel._plot.draw
        panel._plot.draw = lambda m, metric, log: drawn.append(metric) or draw(m, metric, log)  # type: ignore[method-assign]
        try:
            assert wait_for(lambda: panel.redraws >= 1, 60)
            heartbeat(stub, 1, loss=0.5, accuracy=0.9)
            assert wait_for(lambda: list(panel.metric.options) == ["accuracy", "loss"], 60)
            assert wait_for(lambda: panel.redraws >= 2, 60)
            assert panel.metric.value == "loss" and set(drawn) == {"loss"}, drawn
        finally:
            panel.close()


def test_launch_refuses_bad_input_before_starting_anything(tmp_path: Path) -> None:
    lock = threading.Lock()

    def holds_a_lock(ctx: Any) -> None:
        with lock:
            pass

    with pytest.raises(orch.ConfigError, match="holds_a_lock cannot be sent to the worker"):
        orch.launch(holds_a_lock, run_root=str(tmp_path))
    with pytest.raises(orch.ConfigError, match="does not fit this machine"):
        orch.launch(world_size=100_000, run_root=str(tmp_path))
    with pytest.raises(orch.ConfigError, match="world_size"):
        orch.launch(world_size=0, run_root=str(tmp_path))
    with pytest.raises(orch.ConfigError, match="JSON"):
        orch.launch(config={"model": object()}, run_root=str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_a_second_launch_on_the_same_named_port_is_refused(tmp_path: Path) -> None:
    from orch.wire.net import free_port

    port = free_port()
    with orch.launch(
        "jobs:allreduce_steps",
        world_size=2,
        master_port=port,
        config={"steps": 100_000, "sleep": 0.02},
        run_root=str(tmp_path),
    ) as first:
        with pytest.raises(orch.ConfigError, match=f"still running on port {port}"):
            orch.launch(world_size=2, master_port=port, run_root=str(tmp_path))
        assert not first.done


def test_closures_and_lambdas_from_the_caller_reach_the_workers(tmp_path: Path) -> None:
    offset = 7.5
    train = lambda ctx: [ctx.log(s, loss=offset + ctx.rank) for s in ctx.steps(3)]  # noqa: E731
    with orch.launch(train, world_size=2, run_root=str(tmp_path)) as run:
        assert run.wait(timeout=120).state is RunState.SUCCEEDED
        loss = run.history()["loss"]
        assert loss[0]["value"] == [7.5] * 3 and loss[1]["value"] == [8.5] * 3


def test_attach_watches_a_master_started_elsewhere(tmp_path: Path, widget_messages: list[Any]) -> None:
    with orch.launch(
        "jobs:allreduce_steps", world_size=2, config={"steps": 20}, run_root=str(tmp_path)
    ) as run:
        attached = orch.attach(run.address, token=run.token)
        try:
            panel = attached.panel(interval=0.1)
            final = attached.wait(timeout=120)
            assert final.state is RunState.SUCCEEDED
            assert panel.wait_done(30)
            assert 'data-state="SUCCEEDED"' in panel.header.value
            assert attached.history()["loss"][1]["step"] == list(range(20))
        finally:
            attached.close()


def test_live_runs_are_torn_down_when_the_interpreter_exits(tmp_path: Path) -> None:
    script = (
        "import sys, orch\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        f"run = orch.launch('jobs:allreduce_steps', world_size=2, run_root={str(tmp_path)!r},\n"
        "                  config={'steps': 100000, 'sleep': 0.02})\n"
        "from orch.views.waiting import wait_for\n"
        "assert wait_for(lambda: run.state().state.value == 'RUNNING', 60)\n"
        "print('pids', *[p.pid for p in run.procs], flush=True)\n"
        # the interpreter exits here without closing the run
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    pids = [int(p) for p in proc.stdout.split()[1:]]
    assert len(pids) == 2
    # no_leftover_processes (conftest) fails this test if either worker is still alive


def test_the_panel_s_own_pick_follows_a_loss_that_comes_after_orch_s_memory() -> None:
    """orch's rank/memory reaches the panel before the code's first loss (a slow first step, a
    Lightning run): the panel never picks it, lists it after the code's metrics, and picks the
    loss when it comes; a metric the user picked stays."""
    coord = Coordinator(RunPlan(1), run_id="r", clock=lambda: 100.0)
    coord.register(pb.RegisterRequest(worker_id="w", host="h", pid=1, rendezvous_port=29400))
    coord.can_start(pb.CanStartTrainingRequest(run_id="r", worker_id="w"))

    def heartbeat(stub: pb_grpc.OrchestratorStub, step: int, **metrics: float) -> None:
        series = [pb.Series(name=k, steps=[step], values=[v]) for k, v in metrics.items()]
        beat = pb.HeartbeatRequest(run_id="r", worker_id="w", step=step, series=series)
        stub.SendHeartbeat(beat, timeout=60)

    with MasterServer(coord, port=0) as server, grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.OrchestratorStub(channel)
        heartbeat(stub, 0, **{"rank/memory": 3e8})
        panel = Panel(_Source(server.address), interval=0.05)
        try:
            assert wait_for(lambda: list(panel.metric.options) == ["loss", "rank/memory"], 60)
            assert panel.metric.value == "loss"  # waited for: "waiting for the first points"
            heartbeat(stub, 1, train_loss=0.5, **{"rank/memory": 3e8})
            assert wait_for(lambda: list(panel.metric.options) == ["train_loss", "rank/memory"], 60)
            assert panel.metric.value == "train_loss"
            panel.metric.value = "rank/memory"  # the user's pick
            heartbeat(stub, 2, train_loss=0.4, accuracy=0.9, **{"rank/memory": 3e8})
            assert wait_for(lambda: "accuracy" in panel.metric.options, 60)
            assert list(panel.metric.options) == ["accuracy", "train_loss", "rank/memory"]
            assert panel.metric.value == "rank/memory"
        finally:
            panel.close()


class _Logs(_Source):
    """A source whose ranks' log files appear when the test says."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.files: dict[str, Path] = {}

    def log_files(self) -> dict[str, Path]:
        return dict(self.files)


def test_the_log_below_is_rank_0s_once_it_has_one_unless_the_user_picked_another(
    widget_messages: list[Any], tmp_path: Path
) -> None:
    """Rank 1's log can appear before rank 0's (its process started first): the panel shows it
    meanwhile, then rank 0's, as the saved record does; a rank the user picked stays picked."""
    coord = Coordinator(RunPlan(2), run_id="r", clock=lambda: 100.0)
    for i in range(2):
        coord.register(pb.RegisterRequest(worker_id=f"w{i}", host="h", pid=i, rendezvous_port=29400))
        (tmp_path / f"w{i}.log").write_text(f"line of rank {i}\n")
    with MasterServer(coord, port=0) as server:
        source = _Logs(server.address)
        source.files = {"w1": tmp_path / "w1.log"}
        panel = Panel(source, interval=0.05)
        try:
            assert wait_for(lambda: panel.log_rank.value == 1, 60)
            source.files = {"w0": tmp_path / "w0.log", "w1": tmp_path / "w1.log"}
            assert wait_for(lambda: panel.log_rank.value == 0, 60)
            panel.log_rank.value = 1  # the user's pick
            source.files = {"w1": tmp_path / "w1.log"}
            assert wait_for(lambda: list(panel.log_rank.options) == [("rank 1", 1)], 60)
            source.files = {"w0": tmp_path / "w0.log", "w1": tmp_path / "w1.log"}
            assert wait_for(lambda: len(panel.log_rank.options) == 2, 60)
            assert panel.log_rank.value == 1
        finally:
            panel.close()
