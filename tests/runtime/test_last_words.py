"""A rank that is ended (its launcher's SIGTERM, the master's ABORT, a peer's broken collective)
sends the points it logged before it exits: its history and its step agree, on disk as in the
master (orch.runtime._sender.HeartbeatSender.last_words, orch.runtime._children.end_with_sigterm).
A rank killed outright may lose its last beat interval's points, and its record says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import orch
from orch.runtime._sender import HeartbeatSender
from orch.wire._proto import orchestrator_pb2 as pb

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).resolve()


def rank1_fails_at_step_20(ctx: Any) -> None:
    """A fast loop in lockstep (DDP's all-reduce each step, no sleep) whose rank 1 raises at step 20."""
    import torch

    model = ctx.ddp(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in ctx.steps(100):
        if ctx.rank == 1 and step == 20:
            raise RuntimeError("rank 1 fails at step 20")
        loss = model(torch.ones(2, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(step, loss=loss.item())


def test_a_rank_ended_by_a_peers_failure_keeps_every_point_it_logged(tmp_path: Path) -> None:
    """Ten runs in a row: rank 0 is ended by rank 1's failure (torn down by SIGTERM, aborted by the
    master, or its collective broken, whichever comes first) while its points are in its queue."""
    seen = []
    for i in range(10):
        run = orch.launch(f"{HERE}:rank1_fails_at_step_20", world_size=2, run_root=str(tmp_path / "runs"))
        try:
            with pytest.raises(orch.RunFailed, match="rank 1 fails at step 20"):
                run.wait(timeout=120)
            state, history = run.state(), run.history()
        finally:
            run.close()
        on_disk = orch.load_run(run.run_dir).history()
        result = json.loads((run.run_dir / "result.json").read_text())
        rank0 = next(r for r in state.ranks if r.rank == 0)
        steps = history.get("loss", {}).get(0, {}).get("step", [])
        seen.append((i, rank0.exit_code, len(steps)))
        # Every step it logged, 0 .. its last, in the master and on disk; its step says as much.
        assert len(steps) >= 20 and steps == list(range(len(steps))), seen
        assert on_disk["loss"][0]["step"] == steps, seen
        assert rank0.step == len(steps) == result["ranks"][0]["step"], (seen, rank0.step)
        assert not rank0.note, rank0.note  # it said its last words: nothing may be missing


class _Master:
    """A stub master that keeps every heartbeat; ``reply`` is what it answers."""

    def __init__(self, reply: int = pb.CONTINUE) -> None:
        self.requests: list[pb.HeartbeatRequest] = []
        self.reply = reply

    def SendHeartbeat(self, request: pb.HeartbeatRequest, timeout: float) -> pb.HeartbeatResponse:
        self.requests.append(request)
        return pb.HeartbeatResponse(command=self.reply)  # type: ignore[arg-type]

    def steps(self) -> list[list[int]]:
        return [[step for s in r.series for step in s.steps] for r in self.requests]


def _sender(master: _Master, **kw: Any) -> HeartbeatSender:
    return HeartbeatSender(
        master,  # type: ignore[arg-type]
        run_id="r",
        worker_id="w",
        on_stop=lambda at_step: None,
        on_abort=lambda reason: None,
        **kw,
    )


def test_last_words_send_what_was_logged_and_nothing_after() -> None:
    master = _Master(reply=pb.ABORT)  # an ABORT in their replies changes nothing
    sender = _sender(master, max_batch=2)
    sender.step = 5  # ctx.steps is at step 5: steps 0 .. 4 done
    for step in range(5):
        sender.log(step, {"loss": float(step)})
    assert sender.last_words(timeout=5.0)
    assert master.steps() == [[0, 1], [2, 3], [4]]
    assert [r.step for r in master.requests] == [5, 5, 5]
    sender.log(5, {"loss": 5.0})  # the training thread goes on a little while the process ends
    sender.step = 7
    sender.hear()
    assert not sender._beat()
    assert len(master.requests) == 3 and sender.progress == 5


def test_an_aborted_rank_counts_no_step_after_its_last_points() -> None:
    """The master's ABORT: the points queued go with the step they reach, then nothing."""
    master = _Master(reply=pb.ABORT)
    aborted: list[str] = []
    sender = _sender(master)
    sender._on_abort = aborted.append
    sender.log(0, {"loss": 1.0})
    assert sender._beat()
    sender.log(1, {"loss": 1.0})  # logged after the abort: neither sent nor counted
    assert master.steps() == [[0]] and [r.step for r in master.requests] == [1]
    assert aborted and sender.progress == 1 and not sender._beat()


SIGTERM_PROGRAM = """
import datetime, os, sys, time
from pathlib import Path
import torch.distributed as dist
from orch.runtime._children import end_with_sigterm, say_last_words

out = Path(sys.argv[1])
end_with_sigterm()
say_last_words(lambda: out.joinpath("said").write_text(str(os.getpid())))
if sys.argv[2] == "child":
    pid = os.fork()
    if pid == 0:  # a forked child (a DataLoader's worker): its SIGTERM is its own
        time.sleep(60)
        os._exit(0)
    out.joinpath("child").write_text(str(pid))
store = dist.FileStore(str(out / "store"), 1)
store.set_timeout(datetime.timedelta(seconds=60))
out.joinpath("ready").touch()
store.get("never")  # blocked in C++ for 60 s: Python's own handler would wait for it
"""


def _start(tmp_path: Path, mode: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SIGTERM_PROGRAM), str(tmp_path), mode])
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.returncode
        time.sleep(0.02)
    return proc


def test_sigterm_says_the_last_words_while_the_main_thread_is_blocked_in_c(tmp_path: Path) -> None:
    proc = _start(tmp_path, "alone")
    began = time.monotonic()
    proc.terminate()
    assert proc.wait(10) == -signal.SIGTERM  # the launcher still reads a death by SIGTERM
    assert time.monotonic() - began < 5  # not the 60 s the blocked call would take
    assert (tmp_path / "said").read_text() == str(proc.pid)


def test_a_forked_childs_sigterm_is_its_own(tmp_path: Path) -> None:
    proc = _start(tmp_path, "child")
    child = int((tmp_path / "child").read_text())
    try:
        os.kill(child, signal.SIGTERM)
        time.sleep(1.0)
        assert proc.poll() is None and not (tmp_path / "said").exists()
    finally:
        proc.terminate()
        assert proc.wait(10) == -signal.SIGTERM
    assert (tmp_path / "said").read_text() == str(proc.pid)
