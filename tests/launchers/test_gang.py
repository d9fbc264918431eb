"""A gang: ranks that stay up across calls (orch.gang), each call a run. Real processes, a
real gloo process group kept from call to call, a real kernel for the %%orch magic."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import jobs
import orch
from conftest import TESTS, notebook_kernel

pytestmark = pytest.mark.timeout(240)


def test_three_calls_share_one_model_and_end_where_one_run_of_the_same_steps_ends(tmp_path: Path) -> None:
    with orch.gang(world_size=2, run_root=str(tmp_path)) as gang:
        pids = gang.pids
        assert gang.run(jobs.gang_build).wait().state is orch.RunState.SUCCEEDED
        results = [gang.run(jobs.gang_train, 5).wait() for _ in range(3)]
        assert gang.pids == pids  # the same processes all along: no restart, no new group
        losses = [r.final_loss[0] for r in results]
        assert losses[0] > losses[1] > losses[2]  # each call goes on from where the last left off
        assert [r.steps for r in results] == [[5, 5]] * 3
        calls = gang.calls
        assert len(calls) == 4 and len({c.run_id for c in calls}) == 4  # each call a run of its own
    with orch.launch(
        "jobs:gang_in_one_run", world_size=2, config={"steps": 5}, run_root=str(tmp_path)
    ) as run:
        one = run.wait().value
    for key, value in results[-1].value.items():
        assert torch.allclose(value, one[key], atol=1e-6), key
    assert not any(os.path.exists(f"/proc/{p}") for p in pids)


def test_pull_and_push_move_objects_between_the_kernel_and_the_ranks(tmp_path: Path) -> None:
    with orch.gang(world_size=2, run_root=str(tmp_path)) as gang:
        gang.run(jobs.gang_build).wait()
        x1 = gang.pull("x", rank=1)
        assert isinstance(x1, torch.Tensor) and x1.shape == (16, 4)
        torch.manual_seed(2)  # what rank 1 drew
        assert torch.equal(x1, torch.randn(16, 4))
        gang.push(scale=3.0)
        assert gang.run_cell("y.sum().item() * scale", "<cell>").wait().values == pytest.approx(
            [3 * gang.pull("y", 0).sum().item(), 3 * x1.sum().item()]
        )
        with pytest.raises(orch.RunFailed, match="name 'nope' is not defined on rank 0"):
            gang.pull("nope")


def test_a_call_raising_on_every_rank_keeps_the_same_processes_their_state_and_their_group(
    tmp_path: Path,
) -> None:
    with orch.gang(world_size=2, run_root=str(tmp_path)) as gang:
        gang.run(jobs.gang_keep, "a tensor").wait()
        pids = gang.pids
        with pytest.raises(orch.RunFailed) as failed:
            gang.run(jobs.gang_name_error).wait(timeout=120)
        assert "name 'undefined_name' is not defined" in str(failed.value)
        assert "kept its ranks and their ctx.state, and their process group" in str(failed.value)
        after = gang.run(jobs.gang_all_reduce).wait(timeout=120).values
        assert gang.pids == pids and [v["pid"] for v in after] == pids  # the same processes
        assert [v["kept"] for v in after] == ["a tensor"] * 2 and after[0]["sum"] == 3.0
        assert gang.restarts == 0 and gang.remakes == 0  # nothing was broken: nothing made again


def test_a_rank_failing_while_its_peer_waits_in_all_reduce_is_mended_in_the_same_processes(
    tmp_path: Path,
) -> None:
    """Rank 1 raises while rank 0 waits for it in an all_reduce that will never finish: rank 0
    is freed (its group's connections shut down), the call fails naming rank 1 alone, and the
    next call remakes the group among the same processes, their ctx.state kept."""
    with orch.gang(world_size=2, run_root=str(tmp_path)) as gang:
        gang.run(jobs.gang_keep, 7).wait()
        pids = gang.pids
        t0 = time.monotonic()
        with pytest.raises(orch.RunFailed) as failed:
            gang.run(jobs.gang_all_reduce_rank1_raises).wait(timeout=120)
        failed_in = time.monotonic() - t0
        assert failed.value.rank == 1 and "boom on rank 1" in str(failed.value)
        assert "makes their process group again in the same processes" in str(failed.value)
        ranks = {r.rank: r for r in failed.value.state.ranks}
        assert ranks[0].state is orch.RankState.STOPPED and "rank 1 failed" in ranks[0].error
        t0 = time.monotonic()
        after = gang.run(jobs.gang_all_reduce).wait(timeout=120).values
        remade_in = time.monotonic() - t0
        print(f"\nthe call failed in {failed_in:.2f}s; the next, its group remade, took {remade_in:.2f}s")
        assert [v["pid"] for v in after] == pids and [v["kept"] for v in after] == [7, 7]
        assert [v["sum"] for v in after] == [3.0, 3.0]  # a working group, in the same processes
        assert gang.restarts == 0 and gang.remakes == 1
        # the gang's rank 0 that was in no collective, sleeping in its own code: interrupted
        with pytest.raises(orch.RunFailed, match="boom on rank 1"):
            gang.run(jobs.gang_sleep_rank1_raises).wait(timeout=120)
        assert gang.pull("slept") is False and gang.pids == pids
        assert gang.run(jobs.gang_all_reduce).wait(timeout=120).values[0]["sum"] == 3.0


def test_a_stop_past_its_grace_ends_the_call_and_keeps_the_gang_with_its_group_made_again(
    tmp_path: Path,
) -> None:
    """Rank 1 never reaches a step boundary and rank 0 waits for it in an all_reduce: Stop
    ends the call after stop_grace (both ranks freed), and the gang keeps its state."""
    with orch.gang(world_size=2, run_root=str(tmp_path), stop_grace=1.0) as gang:
        gang.run(jobs.gang_keep, "kept").wait()
        pids = gang.pids
        run = gang.run(jobs.gang_rank1_never_steps)
        deadline = time.monotonic() + 60
        while not any(r.step > 0 or r.state == orch.RankState.RUNNING for r in run.state().ranks):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)
        run.stop()
        assert run.wait(timeout=60).state is orch.RunState.STOPPED
        after = gang.run(jobs.gang_all_reduce).wait(timeout=120).values
        assert [v["pid"] for v in after] == pids and [v["kept"] for v in after] == ["kept"] * 2
        assert after[0]["sum"] == 3.0 and gang.remakes == 1 and gang.restarts == 0


def test_a_ddp_model_trained_across_a_failed_call_ends_where_one_run_of_the_same_steps_ends(
    tmp_path: Path,
) -> None:
    """The failed call broke the gradient all-reduce mid-backward: the group is made again and the
    ctx.ddp model rewrapped on it, in place, and training goes on as if the call never ran."""
    with orch.gang(world_size=2, run_root=str(tmp_path)) as gang:
        gang.run(jobs.gang_build).wait()
        gang.run(jobs.gang_train, 5).wait()
        with pytest.raises(orch.RunFailed, match="bad batch on rank 1"):
            gang.run(jobs.gang_train_rank1_fails).wait(timeout=120)
        gang.run(jobs.gang_train, 5).wait()
        trained = gang.run(jobs.gang_train, 5).wait()
        assert gang.remakes == 1 and gang.restarts == 0
        # the rewrapped model still syncs its gradients: both ranks hold the same parameters
        assert trained.param_checksums[0] == trained.param_checksums[1] != ""
    with orch.launch(
        "jobs:gang_in_one_run", world_size=2, config={"steps": 5}, run_root=str(tmp_path)
    ) as run:
        one = run.wait().value
    for key, value in trained.value.items():
        assert torch.allclose(value, one[key], atol=1e-6), key


def test_a_rank_in_a_native_call_that_never_returns_ends_the_gang_saying_what_was_lost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with orch.gang(world_size=2, run_root=str(tmp_path)) as gang:
        gang.run(jobs.gang_keep, 1).wait()
        before = gang.pids
        with pytest.raises(orch.RunFailed) as failed:
            gang.run(jobs.gang_native_rank1_raises).wait(timeout=120)
        said = str(failed.value)
        assert failed.value.rank == 1 and "rank 0 did not end its part within 10s" in said
        assert "ended its ranks; the next call starts them afresh, without their ctx.state" in said
        assert not gang.pids  # ended with the failed call
        # the next call says so, and runs on fresh ranks whose namespace is empty
        assert gang.run_cell("'kept' in dir()", "<cell>").wait().values == [False, False]
        assert "started afresh" in capsys.readouterr().out and gang.restarts == 1
        assert set(gang.pids).isdisjoint(before)
    assert not any(_running(p) for p in before)


def test_a_rank_killed_mid_call_fails_the_call_naming_it_and_the_gang_comes_back(tmp_path: Path) -> None:
    with orch.gang(world_size=2, run_root=str(tmp_path)) as gang:
        run = gang.run(jobs.gang_slow)
        deadline = time.monotonic() + 60
        while min([r.step for r in run.state().ranks] or [0]) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(gang.pids[1], signal.SIGKILL)  # one pid, as the OOM killer does
        with pytest.raises(orch.RunFailed) as failed:
            run.wait(timeout=120)
        assert failed.value.rank == 1 and "SIGKILL" in str(failed.value)
        assert "rank 1's process ended (signal SIGKILL)" in str(failed.value)
        assert "the next call starts them afresh, without their ctx.state" in str(failed.value)
        assert gang.run_cell("ctx.rank", "<cell>").wait().values == [0, 1]


def _until_stepping(run: orch.Run, step: int) -> None:
    """Wait until every rank of the call is past ``step``."""
    deadline = time.monotonic() + 60
    while min([r.step for r in run.state().ranks] or [0]) <= step:
        assert time.monotonic() < deadline, "the call's ranks never got going"
        time.sleep(0.05)


def test_stop_interrupts_the_call_at_a_step_boundary_and_the_gang_stays_up(tmp_path: Path) -> None:
    with orch.gang(world_size=2, run_root=str(tmp_path)) as gang:
        gang.push(mark="kept")
        pids = gang.pids
        run = gang.run(jobs.gang_slow_marked)
        _until_stepping(run, 3)
        run.stop()
        result = run.wait(timeout=60)
        assert result.state is orch.RunState.STOPPED and result.steps[0] == result.steps[1] > 0
        assert gang.pids == pids and gang.pull("mark") == "kept"
        # the ranks raised KeyboardInterrupt at the same step boundary: the loop's code after
        # it never ran, an except/finally did, on every rank
        assert (
            gang.run_cell("(interrupted, 'after_loop' in dir())", "<cell>").wait().values
            == [(True, False)] * 2
        )


GANG_CELLS = [
    "import orch\ngang = orch.gang(world_size=2, run_root={root!r})",
    "%%orch gang\nimport torch\nw = torch.ones(3) * (ctx.rank + 1)\nprint('rank', ctx.rank, 'made w')",
    "%%orch gang\nw.sum().item()",
    "print('pulled', gang.pull('w', rank=1).tolist())",
    "%%orch gang\nimport time\nfor step in ctx.steps(100000):\n"
    "    if step == 3:\n        print('at step', step, flush=True)\n    time.sleep(0.01)",
    "%%orch gang\nw.sum().item() + 100",
    "%%orch gang\nundefined_name + 1",
]


def _execute(kc: Any, code: str, timeout: float = 120) -> tuple[dict[str, Any], str]:
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        content = msg["content"]
        if msg["msg_type"] == "stream":
            out.append(content["text"])
        elif msg["msg_type"] == "execute_result":
            out.append("OUT " + content["data"].get("text/plain", ""))
        elif msg["msg_type"] == "error":
            out.append(f"ERROR {content['ename']}: {content['evalue']}")

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return reply["content"], "".join(out)


def test_orch_cells_keep_their_names_on_every_rank_in_a_real_kernel(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    with notebook_kernel(tmp_path, env=env) as (km, kc):
        reply, _ = _execute(kc, GANG_CELLS[0].format(root=str(tmp_path / "runs")))
        assert reply["status"] == "ok", reply
        reply, shown = _execute(kc, GANG_CELLS[1])
        assert reply["status"] == "ok", shown
        assert "rank 0 made w" in shown  # rank 0's output, in the cell
        reply, shown = _execute(kc, GANG_CELLS[2])
        assert "OUT 3.0" in shown, shown  # a name of the cell before, rank 0's value as the Out
        reply, shown = _execute(kc, GANG_CELLS[3])
        assert "pulled [2.0, 2.0, 2.0]" in shown, shown
        # Interrupt mid-call: the call stops at the ranks' next step, the gang stays up
        sent = kc.execute(GANG_CELLS[4])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the call is under way: rank 0's line is in the cell
            msg = kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") == sent and "at step 3" in msg["content"].get("text", ""):
                break
        else:
            raise AssertionError("the interrupted cell's call never reached step 3")
        km.interrupt_kernel()
        shown = ""
        while True:  # the interrupted cell's messages, to its end (idle): the next cell is not aborted
            msg = kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != sent:
                continue
            if msg["msg_type"] == "error":
                shown = msg["content"]["evalue"]
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        assert (
            "raised KeyboardInterrupt at their next step boundary" in shown
            and "is up for the next cell" in shown
        )
        reply, shown = _execute(kc, GANG_CELLS[5])
        assert "OUT 103.0" in shown, (reply, shown)  # the names survived the interrupted call
        reply, shown = _execute(kc, GANG_CELLS[6])
        assert reply["status"] == "error" and "undefined_name" in shown, shown
        assert "(at Cell In[" in shown and "line 1, in <module>)" in shown, shown  # the cell's line
        _execute(kc, "gang.close()")


KILLED_KERNEL = """
import sys, time
sys.path.insert(0, {tests!r})
import orch
gang = orch.gang(world_size=2, run_root={root!r})
gang.run_cell("x = 1", "<cell>").wait()
print(*gang.pids, flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    """The process still runs: it exists and has not exited (a zombie has: its parent, the
    workers' forkserver gone with the kernel, leaves the reaping to whoever adopts it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_kernel_killed_alone_while_its_gang_is_idle_takes_every_rank_with_it(tmp_path: Path) -> None:
    kernel = subprocess.Popen(
        [sys.executable, "-c", KILLED_KERNEL.format(tests=str(TESTS), root=str(tmp_path))],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert kernel.stdout is not None
    pids = [int(p) for p in kernel.stdout.readline().split()]
    assert len(pids) == 2 and all(os.path.exists(f"/proc/{p}") for p in pids)
    kernel.kill()  # SIGKILL, the kernel's pid alone
    kernel.wait()
    kernel.stdout.close()
    killed = time.monotonic()
    while any(_running(p) for p in pids) and time.monotonic() - killed < 10:
        time.sleep(0.02)
    took = time.monotonic() - killed
    assert not any(_running(p) for p in pids), pids
    print(f"\nevery rank of the gang gone {took:.2f}s after its kernel was SIGKILLed")
    assert took < 2.0


def test_a_gang_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    with pytest.raises(orch.ConfigError, match="unknown option"):
        orch.gang(world_size=2, run_root=str(tmp_path), bogus=1)  # type: ignore[call-arg]
    with orch.gang(world_size=2, run_root=str(tmp_path)) as gang:
        with pytest.raises(orch.OrchError, match="takes a function of ctx"):
            gang.run("jobs:gang_build")  # type: ignore[arg-type]
        run = gang.run(jobs.gang_slow)
        with pytest.raises(orch.OrchError, match="is running call 1"):
            gang.run(jobs.gang_build)
        run.stop()
        run.wait(timeout=60)
    with pytest.raises(orch.OrchError, match="is closed"):
        gang.run(jobs.gang_build)


def test_a_hang_inside_a_call_shows_as_a_hang_with_every_ranks_stack(tmp_path: Path) -> None:
    """Rank 1 blocks in its own code mid-call: the call is "not progressing" as a run is, its
    stacks say where each rank stands, on_hang='fail' ends it, and the next call finds fresh ranks."""
    with orch.gang(world_size=2, run_root=str(tmp_path), hang_timeout=3.0, on_hang="fail") as gang:
        with pytest.raises(orch.RunFailed) as failed:
            gang.run(jobs.hang_rank1).wait(timeout=120)
        assert "no progress for" in str(failed.value) and "on_hang='fail' ended it" in str(failed.value)
        stacks = failed.value.traceback  # each rank where it stands: rank 1 in its own code
        assert "rank 1: in `time.sleep(10**6)`" in stacks and "rank 0: in `loss.backward()`" in stacks
        assert gang.run_cell("ctx.rank", "<cell>").wait(timeout=120).values == [0, 1]


def test_a_ddp_model_wrapped_in_an_earlier_call_has_its_gradient_collectives_timed(tmp_path: Path) -> None:
    """The straggler judge needs each rank's wait in the gradient all-reduce: a model that
    ctx.ddp wrapped in the gang's first call is timed in the calls that train it."""
    with orch.gang(world_size=2, run_root=str(tmp_path)) as gang:
        gang.run(jobs.gang_build).wait()
        run = gang.run(jobs.gang_train, 250, 0.02)
        run.wait(timeout=120)
        state = run.state()
        assert "not timed" not in state.straggler_note, state.straggler_note
        assert state.stragglers_judged, state.straggler_note
        assert all(r.collective_ms > 0 for r in state.ranks), [r.collective_ms for r in state.ranks]


def test_a_failing_orch_cell_is_named_by_its_own_count_and_a_kernel_name_comes_with_the_way_to_send_it(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    with notebook_kernel(tmp_path, env=env) as (_km, kc):
        root = str(tmp_path / "runs")
        reply, shown = _execute(
            kc, f"import orch, time\nimport numpy as np\ngang = orch.gang(world_size=2, run_root={root!r})"
        )
        assert reply["status"] == "ok", shown
        reply, shown = _execute(kc, "%%orch gang\nx = 41\ntime.sleep(0.01)")
        count = reply["execution_count"]
        assert reply["status"] == "error", shown
        assert f"(at Cell In[{count}], line 2, in <module>)" in shown, (count, shown)  # its own count
        assert "name 'time' is not defined" in shown
        assert "`time` is the kernel's, not the ranks'" in shown and "(`import time`)" in shown, shown
        assert "kept its ranks and their ctx.state" in shown, shown
        reply, shown = _execute(kc, "%%orch gang\nnp.zeros(2)")
        assert "(`import numpy as np`)" in shown, shown
        reply, shown = _execute(kc, "lr = 0.5")
        reply, shown = _execute(kc, "%%orch gang\nx + lr")
        assert "Send it to every rank with `gang.push(lr=lr)`" in shown, shown
        reply, shown = _execute(kc, "gang.push(lr=lr)")
        reply, shown = _execute(kc, "%%orch gang\nx + 1 + lr")
        assert "OUT 42.5" in shown, shown  # the names made before the failed line stayed
        reply, shown = _execute(kc, "[r.name for r in orch.runs(" + repr(root) + ")]")
        assert "call 1: cell In[2]" in shown and "push" not in shown, shown  # a push is no run
        _execute(kc, "gang.close()")


def test_a_failing_orch_cell_shows_its_error_once_without_orchs_frames(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    with notebook_kernel(tmp_path, env=env) as (_km, kc):
        root = str(tmp_path / "runs")
        _execute(kc, f"import orch\ngang = orch.gang(world_size=2, run_root={root!r})")
        reply, shown = _execute(kc, "%%orch gang\nprint('before the failure', flush=True)\n1 / 0")
        assert reply["status"] == "error" and "before the failure" in shown, shown
        assert "orch/runtime" not in shown, shown  # rank 0's log keeps orch's frames; the cell does not
        _execute(kc, "gang.close()")
