"""A rank's failure, as the user reads it (RunFailed, result.json, ``orch show``), starts at the
first frame of the user's code: not at orch's worker, its wrappers, or runpy's frames for a
script; orch's frames below the user's code stay. The rank's log keeps every frame.

Real processes: two gloo ranks on CPU; the first frame of each root cause is compared with
the file the user wrote."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import orch
from conftest import orch_cli

pytestmark = pytest.mark.timeout(240)

HERE = Path(__file__).resolve()
WORKER = "orch/runtime/worker.py"
HEADER = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*(?:File "(?P<file>[^"]+)"|(?P<cell>Cell In\[\d+\])), line \d+, in (?P<fn>.+)$')


def frames(text: str) -> list[tuple[str, str]]:
    """The (file, function) of each frame of a formatted traceback, top to bottom."""
    found = []
    for line in text.splitlines():
        m = _FRAME.match(line)
        if m is not None:
            found.append((m["file"] or m["cell"], m["fn"]))
    return found


def root_causes(run: orch.Run, failed: orch.RunFailed) -> list[str]:
    """The root cause's traceback where the user reads it: RunFailed and result.json."""
    record = json.loads((run.run_dir / "result.json").read_text())
    assert record["root_cause_error"] == failed.traceback
    return [failed.traceback, record["root_cause_error"]]


def rank_log(run: orch.Run, rank: int) -> str:
    worker_id = next(r.worker_id for r in run.state().ranks if r.rank == rank)
    return (run.run_dir / "logs" / f"{worker_id}.log").read_text()


def assert_starts_at(text: str, file: str, function: str) -> None:
    assert HEADER in text, text
    assert frames(text)[0] == (file, function), text


# -- functions defined here, launched as they are and with args= ------------------------------
def _helper(x: float) -> float:
    raise ValueError(f"the data on rank 1 went bad ({x})")


def _fails(ctx):  # type: ignore[no-untyped-def]
    for step in ctx.steps(10):
        ctx.log(step, loss=1.0)
        if ctx.rank == 1 and step == 2:
            _helper(step)


def _fails_with(scale):  # type: ignore[no-untyped-def]
    ctx = orch.context()
    for step in ctx.steps(10):
        ctx.log(step, loss=scale)
        if ctx.rank == 1 and step == 2:
            _helper(scale)


def _logs_a_bad_value(ctx):  # type: ignore[no-untyped-def]
    """orch raises inside ctx.log, below the user's frame; caught and chained by the user."""
    ctx.log(0, loss=1.0)
    if ctx.rank == 1:
        try:
            ctx.log(1, loss="not a number")
        except TypeError as e:
            raise RuntimeError("logging failed on rank 1") from e


@pytest.mark.parametrize(
    ("fn", "args", "first"),
    [(_fails, None, "_fails"), (_fails_with, [2.0], "_fails_with")],
    ids=["fn(ctx)", "fn(*args)"],
)
def test_a_function_s_root_cause_starts_at_the_function(
    tmp_path: Path, fn: object, args: list[float] | None, first: str
) -> None:
    with orch.launch(fn, args=args, world_size=2, run_root=str(tmp_path)) as run:
        with pytest.raises(orch.RunFailed) as failed:
            run.wait(timeout=120)
        assert failed.value.rank == 1
        for text in root_causes(run, failed.value):
            assert_starts_at(text, str(HERE), first)
            assert frames(text)[1] == (str(HERE), "_helper"), text
            assert WORKER not in text and "target.py" not in text, text
            said = "ValueError: the data on rank 1 went bad (2.0)" if args else "went bad (2)"
            assert text.rstrip().endswith(said), text
        log = rank_log(run, 1)
        assert WORKER in log and "_helper" in log  # all of it, for orch's own debugging


def test_orch_s_frames_below_the_user_s_code_stay_in_each_chained_traceback(tmp_path: Path) -> None:
    with orch.launch(_logs_a_bad_value, world_size=2, run_root=str(tmp_path)) as run:
        with pytest.raises(orch.RunFailed) as failed:
            run.wait(timeout=120)
        for text in root_causes(run, failed.value):
            inner, outer = text.split("The above exception was the direct cause of the following exception:")
            # The TypeError orch raised where the user called it: from the user's line to orch's.
            assert_starts_at(inner, str(HERE), "_logs_a_bad_value")
            assert any("orch/runtime/" in file for file, _ in frames(inner)[1:]), inner
            assert "TypeError" in inner.strip().splitlines()[-1], inner
            # The error the user raised from it: from the user's function, not from orch's worker.
            assert_starts_at(outer, str(HERE), "_logs_a_bad_value")
            assert len(frames(outer)) == 1 and WORKER not in text, text
            assert outer.rstrip().endswith("RuntimeError: logging failed on rank 1"), outer
        assert WORKER in rank_log(run, 1)


# -- a script, a -m module -----------------------------------------------------------------------
SCRIPT = """\
import torch.distributed as dist


def load(rank):
    if rank == 1:
        raise FileNotFoundError("no shard for rank 1")


dist.init_process_group("gloo")
dist.barrier()  # both ranks joined the group before rank 1 fails, whatever the machine's load
load(dist.get_rank())
dist.destroy_process_group()
"""


def test_a_script_s_root_cause_starts_at_the_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "fails.py"
    script.write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    with orch.launch("fails.py", world_size=2, run_root=str(tmp_path / "runs")) as run:
        with pytest.raises(orch.RunFailed) as failed:
            run.wait(timeout=120)
        assert failed.value.rank == 1
        for text in root_causes(run, failed.value):
            assert_starts_at(text, str(script), "<module>")
            assert frames(text)[1] == (str(script), "load"), text
            assert "runpy" not in text and "script.py" not in text and WORKER not in text, text
            assert text.rstrip().endswith("FileNotFoundError: no shard for rank 1"), text
        log = rank_log(run, 1)
        assert WORKER in log and "runpy" in log


def test_a_module_s_root_cause_under_orch_run_starts_at_the_module(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(SCRIPT)
    runs = tmp_path / "runs"
    proc = orch_cli(
        "run", "--workers", "2", "--run-root", str(runs), "-m", "pkg.train", env=subprocess_env, cwd=tmp_path
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    [run_dir] = [p for p in runs.iterdir() if (p / "result.json").is_file()]
    text = json.loads((run_dir / "result.json").read_text())["root_cause_error"]
    assert_starts_at(text, str(package / "train.py"), "<module>")
    assert "runpy" not in text and WORKER not in text, text
    shown = orch_cli("show", str(run_dir), env=subprocess_env, timeout=60)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert_starts_at(shown.stdout, str(package / "train.py"), "<module>")
    assert "runpy" not in shown.stdout and WORKER not in shown.stdout, shown.stdout
    logs = "".join(p.read_text() for p in (run_dir / "logs").iterdir())
    assert "FileNotFoundError: no shard for rank 1" in logs and WORKER in logs and "runpy" in logs


# -- a gang's cell and call ---------------------------------------------------------------------
CELL = """\
def load(rank):
    if rank == 1:
        raise KeyError("shard 1")


load(ctx.rank)
"""


def test_a_gang_cell_s_root_cause_starts_at_the_cell(tmp_path: Path) -> None:
    with orch.gang(world_size=2, run_root=str(tmp_path)) as gang:
        cell = "<orch cell In[7]>"
        call = gang.run_cell(CELL, cell)
        with pytest.raises(orch.RunFailed) as failed:
            call.wait(timeout=120)
        assert failed.value.rank == 1
        assert "(at Cell In[7], line 3, in load)" in str(failed.value)
        for text in root_causes(call, failed.value):
            assert_starts_at(text, cell, "<module>")
            assert frames(text) == [(cell, "<module>"), (cell, "load")], text
            assert "gang.py" not in text and WORKER not in text, text
        log = rank_log(call, 1)
        assert WORKER in log and "gang.py" in log and "run_cell" in log

        call = gang.run(_fails)
        with pytest.raises(orch.RunFailed) as failed:
            call.wait(timeout=120)
        for text in root_causes(call, failed.value):
            assert_starts_at(text, str(HERE), "_fails")
            assert "gang.py" not in text and WORKER not in text, text
