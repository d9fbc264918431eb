"""A rank whose code counts no steps (a torchrun script that logs nothing, a library that logs
on rank 0 only) is at its DDP model's training iteration, on two real gloo ranks; a rank
whose code counts its steps (``ctx.steps``, ``ctx.log``) is at those, as before
(orch.runtime._ddp_steps)."""

from __future__ import annotations

import copy
import datetime
import io
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import orch
from orch.wire.states import RunState

pytestmark = pytest.mark.timeout(300)

ORCH = str(Path(sys.executable).parent / "orch")
HERE = Path(__file__).resolve()
LAUNCHER_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "ORCH_RANK_OF"}

# A torchrun script that logs nothing: ITERATIONS optimizer steps of DDP, each of ACCUMULATE
# micro-batches (all but the last under no_sync()), and with --evaluate an evaluation pass
# after each (eval mode, no grad, and a train-mode forward under no_grad): none of them counts.
SCRIPT = """
import sys
import torch
import torch.distributed as dist

accumulate = int(sys.argv[sys.argv.index("--accumulate") + 1]) if "--accumulate" in sys.argv else 1
dist.init_process_group()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    for i in range(accumulate):
        x, y = torch.randn(16, 8), torch.randn(16, 2)
        if i < accumulate - 1:
            with model.no_sync():
                torch.nn.functional.mse_loss(model(x), y).backward()
        else:
            torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    if "--evaluate" in sys.argv:
        with torch.no_grad():
            model(torch.randn(4, 8))
            model.eval()
            model(torch.randn(4, 8))
            model.train()
dist.destroy_process_group()
"""


def _iteration(model: Any, opt: Any) -> float:
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.item())


def _hold(ctx: Any) -> None:
    """Say this rank got here, then wait for the test's go (a file)."""
    Path(ctx.config["dir"], f"held-rank{ctx.rank}").touch()
    go = Path(ctx.config["dir"], "go")
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def only_rank0_logs(ctx: Any) -> None:
    """10 DDP iterations; rank 0 logs each (as a library's rank-0 logger does), rank 1 nothing.
    Both hold after 7."""
    model = ctx.ddp(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(10):
        if i == 7:
            _hold(ctx)
        loss = _iteration(model, opt)
        if ctx.rank == 0:
            ctx.log(i, loss=loss)


def counts_its_steps(ctx: Any) -> None:
    """6 steps of 3 DDP iterations each, counted by ctx.steps or logged by ctx.log; holds in
    step 0 (ctx.steps: after its iterations; ctx.log: after logging it)."""
    model = ctx.ddp(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    by_steps = ctx.config["loop"] == "steps"
    for step in ctx.steps(6) if by_steps else range(6):
        for _ in range(3):
            loss = _iteration(model, opt)
        if not by_steps:
            ctx.log(step, loss=loss)
        if step == 0:
            _hold(ctx)
            # The beats since told the hold's step: the counter came off with the first of them.
            assert "_pre_forward" not in model.__dict__, "DDP's iterations are still counted"


def _held(run: orch.Run, folder: Path) -> orch.StateMirror:
    """The run's state once both ranks hold and each beat since: their steps as they hold."""
    deadline = time.monotonic() + 120
    held: float | None = None
    while time.monotonic() < deadline:
        if held is None and all((folder / f"held-rank{r}").exists() for r in (0, 1)):
            held = time.monotonic()
        if held is not None:
            m = run.state()
            since = time.monotonic() - held
            # Each rank's last beat came at least half a second after it held: it tells the hold.
            if len(m.ranks) == 2 and all(r.heartbeat_age < since - 0.5 for r in m.ranks):
                return m
        time.sleep(0.05)
    raise AssertionError(f"the ranks did not hold within 120s: {run.state().as_dict()}")


def _launch(fn: str, tmp_path: Path, **config: Any) -> orch.Run:
    return orch.launch(
        f"{HERE}:{fn}",
        world_size=2,
        config={"dir": str(tmp_path), **config},
        run_root=str(tmp_path / "runs"),
        heartbeat_timeout=60,
    )


@pytest.mark.parametrize("args", [[], ["--accumulate", "2", "--evaluate"]])
def test_a_script_that_logs_nothing_is_at_its_ddp_iteration(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    proc = subprocess.run(
        [ORCH, "run", "--workers", "2", "train.py", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 5 optimizer steps on each rank: step 5, as a loop that logged steps 0 .. 4 is at.
    assert "rank 0: SUCCEEDED, step 5, loss -" in proc.stdout, proc.stdout
    assert "rank 1: SUCCEEDED, step 5, loss -" in proc.stdout, proc.stdout
    run_dir = next((tmp_path / "runs").iterdir())
    m = orch.load_run(run_dir).state()
    assert [r.step for r in m.ranks] == [5, 5] and m.progress() == (5, 0)
    result = json.loads((run_dir / "result.json").read_text())
    assert [r["step"] for r in result["ranks"]] == [5, 5]


def test_a_rank_that_does_not_log_follows_its_ddp_iterations_live(tmp_path: Path) -> None:
    with _launch("only_rank0_logs", tmp_path) as run:
        m = _held(run, tmp_path)
        assert m.state is RunState.RUNNING
        # Rank 0 logged steps 0 .. 6; rank 1 logged nothing and trained 7 iterations.
        assert [r.step for r in m.ranks] == [7, 7], m.as_dict()
        (tmp_path / "go").touch()
        assert run.wait(timeout=120).state is orch.RunState.SUCCEEDED
        assert [r.step for r in run.state().ranks] == [10, 10]
        assert len(run.history()["loss"][0]["step"]) == 10 and 1 not in run.history()["loss"]


@pytest.mark.parametrize(("loop", "at_hold"), [("steps", 0), ("log", 1)])
def test_a_rank_that_counts_its_steps_is_at_them_not_at_its_ddp_iterations(
    tmp_path: Path, loop: str, at_hold: int
) -> None:
    with _launch("counts_its_steps", tmp_path, loop=loop) as run:
        m = _held(run, tmp_path)
        # 3 DDP iterations done: ctx.steps is in step 0, ctx.log logged step 0 (one step done).
        assert [r.step for r in m.ranks] == [at_hold, at_hold], m.as_dict()
        (tmp_path / "go").touch()
        assert run.wait(timeout=120).state is orch.RunState.SUCCEEDED
        assert [r.step for r in run.state().ranks] == [6, 6]  # not the 18 DDP iterations


def _counting_rules(out: str, store_path: str) -> None:
    """One rank: what counts as an iteration, a copy, a pickle, and the counters taken off."""
    from orch.runtime._ddp_steps import Iterations

    seen: dict[str, Any] = {}
    store = dist.FileStore(store_path, 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=20))
    first = Iterations()  # a gang's first call
    before = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    for _ in range(2):
        _iteration(before, torch.optim.SGD(before.parameters(), lr=0.01))
    seen["first"] = first()
    iterations = Iterations()  # the next call counts its own iterations
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        _iteration(model, opt)
    with model.no_sync():
        model(torch.randn(8, 4)).sum().backward()
    with torch.no_grad():
        model(torch.randn(8, 4))
    model.eval()
    model(torch.randn(8, 4))
    model.train()
    seen["counted"] = iterations()  # 3: not the no_sync, no_grad and eval forwards
    for _ in range(5):
        _iteration(before, torch.optim.SGD(before.parameters(), lr=0.01))
    seen["furthest"] = iterations()  # 5 of the model made before: the furthest model's
    buffer = io.BytesIO()
    torch.save(model, buffer)  # the model pickles
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    twin = copy.deepcopy(model)
    seen["copies_plain"] = "_pre_forward" not in loaded.__dict__ and "_pre_forward" not in twin.__dict__
    _iteration(twin, torch.optim.SGD(twin.parameters(), lr=0.01))
    seen["after_copy"] = iterations()  # 5: the copy counts not for its original
    iterations.close()
    seen["closed_plain"] = "_pre_forward" not in model.__dict__ and "_pre_forward" not in before.__dict__
    _iteration(model, opt)
    seen["after_close"] = iterations()
    Path(out).write_text(json.dumps(seen))
    dist.destroy_process_group()
    os._exit(0)  # as orch's ranks leave: gloo's threads can abort an interpreter's own teardown


def test_what_counts_as_an_iteration(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    p = mp.get_context("spawn").Process(target=_counting_rules, args=(str(out), str(tmp_path / "store")))
    p.start()
    p.join(120)
    assert p.exitcode == 0
    assert json.loads(out.read_text()) == {
        "first": 2,
        "counted": 3,
        "furthest": 5,
        "copies_plain": True,
        "after_copy": 5,
        "closed_plain": True,
        "after_close": 5,
    }
