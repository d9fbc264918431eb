"""Numbers that agree from one view to the next (units: run dirs made by hand, no process).

A pruned config's step is its rung, in the results, the dashboard's rows and the sweep panel's;
a metric's "last" value says its step when it was logged before the run's last step; every bad
argument of ``orch logs`` exits 2, ``--rank 7`` of a run of two ranks included; ``orch.load_run``
takes a run id or its start, as ``orch show`` does; ``orch runs`` writes a drawn config's
floats with 4 significant digits.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import orch
from orch.cli import main
from orch.experiments.results import SweepResults, dashboard_rows
from orch.views.sweep_panel import _behind, _state_text
from orch.wire.client import SeriesBuffer, StateMirror

pytestmark = pytest.mark.unit

LR = 0.4457453393648168  # as a search draws it


def _row(index: int, state: str, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "index": index,
        "run_id": f"r{index}",
        "config": {"lr": LR},
        "state": state,
        "reused": False,
        "steps": 240,
        "total": 240,
        "duration": 12.0,
        "failure": "",
        "pruned_at": None,
        "final": {"loss": 0.21, "accuracy": 0.93},
        "last_step": {"loss": 239, "accuracy": 239, "rank/memory": 239},
        "best": {"loss": 0.2, "accuracy": 0.94},
        "nonfinite": {},
    }
    row.update(fields)
    return row


def test_a_pruned_config_s_step_is_its_rung_and_its_last_accuracy_says_its_step() -> None:
    pruned = _row(
        1,
        "PRUNED",
        steps=11,  # its ranks counted the step after the rung
        pruned_at=10,
        final={"loss": 1.9, "accuracy": 0.1056},  # accuracy evaluated at step 0, every 50 steps
        last_step={"loss": 10, "accuracy": 0, "rank/memory": 11},
        best={"loss": 1.9, "accuracy": 0.1056},
    )
    results = SweepResults([_row(0, "SUCCEEDED"), pruned], "digits-search")
    head, body = results.table()
    assert head[-4:] == ["accuracy last", "accuracy best", "loss last", "loss best"]
    cells = dict(zip(head, body[1], strict=True))
    assert cells["state"] == "PRUNED at 10" and cells["step"] == "10/240"
    assert cells["accuracy last"] == "0.1056 (step 0)" and cells["loss last"] == "1.9"
    assert cells["lr"] == "0.4457"
    done = dict(zip(head, body[0], strict=True))
    assert done["step"] == "240/240" and done["accuracy last"] == "0.93"  # logged at its last step
    assert "PRUNED at 10" in results._repr_html_() and "10/240" in repr(results)
    assert [r["step"] for r in dashboard_rows(results)] == [240, 10]


def test_the_sweep_panel_s_row_says_the_same() -> None:
    trial = SimpleNamespace(state="PRUNED", pruned_at=10, reused=False)
    assert _state_text(trial) == "PRUNED at 10"  # type: ignore[arg-type]
    m = StateMirror(run_id="r1")
    for name, steps in (("loss", list(range(11))), ("accuracy", [0]), ("rank/memory", list(range(12)))):
        m.series[(0, name)] = SeriesBuffer()
        m.series[(0, name)].extend(steps, [1.0] * len(steps))
    assert _behind(m, 0) == " (step 0)" and _behind(m, 10) == ""  # orch's memory is not the run's step


def _run_dir(root: Path, run_id: str, config: dict[str, Any] | None = None) -> Path:
    path = root / run_id
    (path / "logs").mkdir(parents=True)
    meta = {"run_id": run_id, "fn": "train.py", "world_size": 2, "config": config or {}, "started": 1.7e9}
    (path / "run.json").write_text(json.dumps(meta))
    said = [f"{run_id}-w{r} on vm pid 9" for r in (0, 1)]
    events = [{"time": 1.7e9, "kind": "registered", "rank": r, "message": m} for r, m in enumerate(said)]
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    for r in (0, 1):
        (path / "logs" / f"{run_id}-w{r}.log").write_text(f"epoch 0 on rank {r}\n")
    return path


def test_every_bad_argument_of_orch_logs_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run_dir(tmp_path, "afebeb388e40")
    root = ["--run-root", str(tmp_path)]
    assert main(["logs", "afebeb388e40", "--rank", "1", *root]) == 0
    assert capsys.readouterr().out == "epoch 0 on rank 1\n"
    assert main(["logs", "afebeb388e40", "--rank", "7", *root]) == 2
    assert "--rank 7: run afebeb388e40 has 2 ranks (0 to 1)" in capsys.readouterr().err
    assert main(["logs", "afebeb388e40", "--rank", "7", "--follow", *root]) == 2  # no wait for a rank 7
    assert main(["logs", "nosuchrun", *root]) == 2
    for bad in ("-1", "x"):
        with pytest.raises(SystemExit) as e:
            main(["logs", "afebeb388e40", "--rank", bad, *root])
        assert e.value.code == 2
    assert "expected a rank (0, 1, ...), got 'x'" in capsys.readouterr().err


def test_load_run_takes_a_run_id_or_its_start_as_orch_show_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _run_dir(tmp_path / "runs", "afebeb388e40")
    _run_dir(tmp_path / "runs", "afe0000000aa")
    monkeypatch.chdir(tmp_path)  # run_root's default, runs/, is here
    for name in ("afebeb388e40", "afeb", path, str(path), Path("runs/afebeb388e40")):
        loaded = orch.load_run(name)
        assert loaded.run_id == "afebeb388e40" and loaded.run_dir.resolve() == path.resolve()
    assert orch.load_run("afebeb", run_root=tmp_path / "runs").run_id == "afebeb388e40"
    with pytest.raises(orch.ConfigError, match="starts 2 run ids"):
        orch.load_run("afe")
    with pytest.raises(orch.ConfigError, match=r"no run 'nosuchrun'.*afebeb388e40"):
        orch.load_run("nosuchrun")


def test_orch_runs_writes_a_drawn_config_with_4_significant_digits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run_dir(tmp_path, "afebeb388e40", {"lr": LR, "opt": "sgd", "betas": [0.9, 0.99912345]})
    assert main(["runs", "--run-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert 'lr=0.4457 opt="sgd" betas=[0.9, 0.9991]' in out, out
    assert "4457453393648168" not in out
    table = orch.runs(str(tmp_path))
    assert "lr=0.4457" in table._repr_html_() and table[0].config["lr"] == LR  # the value itself is kept
