"""TensorBoard export: real runs written out and read back by TensorBoard's own readers.

The event files are read with ``EventAccumulator`` (every event kept), and the hyperparameters
through the HPARAMS tab's own backend (the hparams plugin's ``/session_groups`` route), so
what is checked is what TensorBoard shows. The expected points come from ``metrics.pb``
itself, by a rule of their own: of a rank's metric, the last point logged at each step.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

import orch
from conftest import TESTS
from orch.errors import ConfigError
from orch.record.metrics_log import HEADER, MetricsDamage, read_metrics
from orch.record.store import RunStore
from orch.record.tensorboard import export_runs
from orch.record.writes import write_json
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.codec import metric_record
from orch.wire.states import RunState

pytestmark = pytest.mark.timeout(240)
sys.path.insert(0, str(TESTS))

Point = tuple[int, float, float]  # step, value, wall time
Points = dict[tuple[int, str], list[Point]]  # (rank, metric) -> points by step


def logged(run_dir: Path) -> Points:
    """What the log holds, by a rule of its own: a (rank, metric, step)'s last point wins."""
    last: dict[tuple[int, str], dict[int, tuple[float, float]]] = {}
    for record in read_metrics(run_dir / "metrics.pb", MetricsDamage()):
        for s in record.series:
            at = last.setdefault((record.rank, s.name), {})
            for step, value, when in zip(s.steps, s.values, s.times, strict=True):
                at[step] = (value, when)
    return {key: [(step, *at[step]) for step in sorted(at)] for key, at in last.items()}


def scalars(folder: Path) -> dict[str, list[Point]]:
    """Every scalar event in ``folder``, read back by TensorBoard, by tag."""
    acc = EventAccumulator(str(folder), size_guidance={"tensors": 0})  # 0: keep every event
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        if acc.SummaryMetadata(tag).plugin_data.plugin_name == "scalars":
            value = tensor_util.make_ndarray
            out[tag] = [(e.step, value(e.tensor_proto).item(), e.wall_time) for e in acc.Tensors(tag)]
    return out


def exported(run_folder: Path, ranks: int | list[int]) -> Points:
    """The exported points of ``ranks`` (a world size: every rank below it)."""
    found: Points = {}
    for rank in range(ranks) if isinstance(ranks, int) else ranks:
        for tag, points in scalars(run_folder / f"rank{rank}").items():
            found[(rank, tag)] = points
    return found


def hparams_tab(logdir: Path) -> dict[str, dict[str, Any]]:
    """The HPARAMS tab's rows, from the hparams plugin's own backend: run name -> its session group."""
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from werkzeug import test, wrappers

    with warnings.catch_warnings():  # its vendored bleach/html5lib warns on import, not ours
        warnings.simplefilter("ignore", DeprecationWarning)
        from tensorboard.plugins.hparams import hparams_plugin

    mux = plugin_event_multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, str(logdir))
    context = base_plugin.TBContext(logdir=str(logdir), multiplexer=mux, data_provider=provider)
    apps = hparams_plugin.HParamsPlugin(context).get_plugin_apps()
    statuses = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]
    request = {"startIndex": 0, "sliceSize": 100, "includeMetrics": True, "allowedStatuses": statuses}
    reply = test.Client(apps["/session_groups"], wrappers.Response).post(
        "/session_groups", data=json.dumps(request), content_type="application/json"
    )
    assert reply.status_code == 200, reply.get_data(as_text=True)
    groups = json.loads(reply.get_data(as_text=True))["sessionGroups"]
    reply = test.Client(apps["/experiment"], wrappers.Response).post(
        "/experiment", data=json.dumps({"includeMetrics": True}), content_type="application/json"
    )
    assert reply.status_code == 200, reply.get_data(as_text=True)
    columns = json.loads(reply.get_data(as_text=True))
    rows = {g["name"]: g for g in groups}
    for row in rows.values():
        row["finals"] = {m["name"]["tag"]: m["value"] for m in row.get("metricValues", [])}
        row["status"] = row["sessions"][0]["status"]
        row["columns"] = columns
    return rows


def final_mean(points: Points, metric: str, world_size: int) -> float:
    return sum(points[(rank, metric)][-1][1] for rank in range(world_size)) / world_size


def test_every_point_of_every_rank_with_its_step_value_and_time(tmp_path: Path) -> None:
    with orch.launch(
        "jobs:allreduce_steps", world_size=2, config={"steps": 12, "sleep": 0.05}, run_root=str(tmp_path)
    ) as run:
        run.wait(timeout=120)
    loaded = orch.load_run(run.run_dir)
    folder = loaded.to_tensorboard(tmp_path / "tb")
    assert folder == tmp_path / "tb" / run.run_id

    want = logged(run.run_dir)
    by_job = {key: points for key, points in want.items() if key[1] != "rank/memory"}  # orch's own
    assert set(by_job) == {(r, m) for r in range(2) for m in ("loss", "rank_seen")}
    assert all([p[0] for p in points] == list(range(12)) for points in by_job.values())
    assert exported(folder, 2) == want  # every point: step, value (a double, exact) and wall time
    for rank in range(2):
        assert [v for _, v, _ in want[(rank, "loss")]] == run.history()["loss"][rank]["value"]

    row = hparams_tab(tmp_path / "tb")[run.run_id]
    assert row["hparams"] == {"fn": "jobs:allreduce_steps", "world_size": 2.0, "steps": 12.0, "sleep": 0.05}
    assert row["status"] == "STATUS_SUCCESS"
    assert row["finals"]["final/loss"] == pytest.approx(final_mean(want, "loss", 2))
    assert row["finals"]["final/rank_seen"] == 0.5


def test_a_restarted_run_writes_each_step_once(tmp_path: Path) -> None:
    run = orch.launch(
        "jobs:checkpointed",
        world_size=2,
        max_restarts=1,
        run_root=str(tmp_path),
        # 50 ms a step: the 5 steps after the checkpoint at 10 span more than a heartbeat, so
        # attempt 1's points for them reach the run dir before rank 1 dies at 15 (and replay).
        config={"steps": 30, "die_at": 15, "die_on_attempts": [1], "sleep": 0.05},
    )
    try:
        assert run.wait(timeout=180).state is RunState.SUCCEEDED
        assert run.coordinator.attempt == 2
    finally:
        run.close()
    rank0_steps = [
        step
        for record in read_metrics(run.run_dir / "metrics.pb")
        if record.rank == 0
        for s in record.series
        if s.name == "loss"
        for step in s.steps
    ]
    assert len(rank0_steps) > len(set(rank0_steps)) == 30  # the replayed steps are in the log twice

    folder = orch.load_run(run.run_dir).to_tensorboard(tmp_path / "tb")
    found = exported(folder, 2)
    # The user's metrics; orch's own rank/memory is sparse (a point a second), and a restart
    # rewinds it from its new attempt's first point, which "the last point wins" does not model.
    users = {key: points for key, points in found.items() if not key[1].startswith("rank/")}
    assert users == {
        key: points for key, points in logged(run.run_dir).items() if not key[1].startswith("rank/")
    }
    for rank in range(2):
        assert [step for step, _, _ in found[(rank, "loss")]] == list(range(30))
        # the last checkpoint before the death at step 15 was after step 9: 10.. are the replay's
        assert [v for _, v, _ in found[(rank, "attempt")]] == [1.0] * 10 + [2.0] * 20
    # the same points as the CSV export, which applies the restart rule on its own
    assert sorted(csv_rows(run.run_dir, tmp_path / "points.csv")) == sorted(
        (rank, metric, step, value) for (rank, metric), pts in found.items() for step, value, _ in pts
    )
    row = hparams_tab(tmp_path / "tb")[run.run_id]
    assert row["hparams"]["die_on_attempts"] == "[1]" and row["hparams"]["die_at"] == 15.0
    assert row["finals"]["final/attempt"] == 2.0


def csv_rows(run_dir: Path, path: Path) -> list[tuple[int, str, int, float]]:
    """``to_csv``'s rows as (rank, metric, step, value)."""
    with orch.load_run(run_dir).to_csv(path).open() as f:
        return [(int(r["rank"]), r["metric"], int(r["step"]), float(r["value"])) for r in csv.DictReader(f)]


def record_offsets(log: Path) -> list[int]:
    data, pos, out = log.read_bytes(), 0, []
    while pos < len(data):
        out.append(pos)
        pos += HEADER.size + HEADER.unpack_from(data, pos)[0]
    return out


def test_a_damaged_log_exports_what_is_intact(tmp_path: Path) -> None:
    with orch.launch(
        "jobs:allreduce_steps", world_size=2, config={"steps": 12, "sleep": 0.1}, run_root=str(tmp_path)
    ) as run:
        run.wait(timeout=120)
    whole = logged(run.run_dir)
    damaged = shutil.copytree(run.run_dir, tmp_path / "damaged")
    log = damaged / "metrics.pb"
    offsets = record_offsets(log)
    assert len(offsets) >= 3, "the run should have sent its points over several heartbeats"
    data = bytearray(log.read_bytes())
    middle = offsets[len(offsets) // 2]
    data[middle + HEADER.size + 2] ^= 0xFF  # a flipped byte in a record's payload
    data += data[: offsets[1] // 2]  # and a record cut short, as a crash leaves it
    log.write_bytes(bytes(data))
    found = MetricsDamage()
    list(read_metrics(log, found))
    assert found.regions == 1 and found.torn_tail is not None

    intact = logged(damaged)
    lost = sum(map(len, whole.values())) - sum(map(len, intact.values()))
    assert 0 < lost < 12, "one record's points are lost, and only those"
    folder = orch.load_run(damaged).to_tensorboard(tmp_path / "tb")
    assert exported(folder, 2) == intact


def write_run(
    run_dir: Path, config: dict[str, Any], batches: list[tuple[int, int, list[pb.Series]]], state: str = ""
) -> Path:
    """A run dir by hand: ``batches`` of (rank, attempt, series); ``result.json`` when ``state``."""
    store = RunStore(run_dir)
    meta = {"run_id": run_dir.name, "fn": "jobs:by_hand", "world_size": 2, "config": config, "started": 100.0}
    store.write_meta(meta)
    for rank, attempt, series in batches:
        append_points(store, rank, attempt, series)
    store.close()
    if state:
        write_json(
            run_dir / "result.json", {"run_id": run_dir.name, "world_size": 2, "state": state, "elapsed": 9.0}
        )
    return run_dir


def loss(steps: list[int], values: list[float], times: list[float] | None = None) -> pb.Series:
    return pb.Series(name="loss", steps=steps, values=values, times=times or [])


def test_a_sweep_shows_its_runs_side_by_side(tmp_path: Path) -> None:
    a = write_run(
        tmp_path / "a",
        {"lr": 0.1, "opt": {"name": "sgd", "nesterov": True}, "layers": [4, 4]},
        [(r, 1, [loss([0, 1], [1.0 + r, 0.5 + r], [101.0, 102.0])]) for r in range(2)],
        "SUCCEEDED",
    )
    b = write_run(
        tmp_path / "b",
        {"lr": 0.01, "opt": {"name": "adam", "nesterov": False}, "layers": [8]},
        [(r, 1, [loss([0, 1, 2], [2.0, 1.0, 0.5 * (r + 1)], [101.0, 102.0, 103.0])]) for r in range(2)],
        "FAILED",
    )
    logdir = export_runs([("lr=0.1", a), ("lr=0.01", orch.load_run(b))], tmp_path / "tb", load=orch.load_run)
    assert sorted(p.name for p in logdir.iterdir()) == ["lr=0.01", "lr=0.1"]
    assert scalars(logdir / "lr=0.1" / "rank1") == {"loss": [(0, 2.0, 101.0), (1, 1.5, 102.0)]}
    rows = hparams_tab(logdir)
    assert rows["lr=0.1"]["hparams"] == {
        "fn": "jobs:by_hand",
        "world_size": 2.0,
        "lr": 0.1,
        "opt.name": "sgd",
        "opt.nesterov": True,
        "layers": "[4, 4]",
    }
    assert rows["lr=0.01"]["hparams"]["opt.name"] == "adam" and rows["lr=0.01"]["hparams"]["lr"] == 0.01
    assert rows["lr=0.1"]["finals"] == {"final/loss": 1.0}  # (0.5 + 1.5) / 2 at step 1
    assert rows["lr=0.01"]["finals"] == {"final/loss": 0.75}
    assert (rows["lr=0.1"]["status"], rows["lr=0.01"]["status"]) == ("STATUS_SUCCESS", "STATUS_FAILURE")
    columns = {h["name"]: h for h in rows["lr=0.1"]["columns"]["hparamInfos"]}
    assert columns["lr"]["differs"] and not columns["fn"]["differs"]
    assert columns["lr"]["type"] == "DATA_TYPE_FLOAT64"
    assert columns["opt.nesterov"]["type"] == "DATA_TYPE_BOOL"


def test_the_restart_rule_nan_and_points_without_times(tmp_path: Path) -> None:
    run = write_run(
        tmp_path / "r",
        {},
        [
            (0, 1, [loss([0, 1, 2, 3], [4.0, 3.0, 2.0, 1.0], [10.0, 11.0, 12.0, 13.0])]),
            (0, 1, [pb.Series(name="acc", steps=[0, 1], values=[0.1, 0.2])]),  # no times: an old log
            (0, 2, [loss([2, 3], [20.0, math.nan], [30.0, 31.0])]),  # attempt 2 replays from step 2
            (0, 2, [loss([4], [40.0], [32.0])]),
        ],
    )
    folder = orch.load_run(run).to_tensorboard(tmp_path / "tb")
    found = scalars(folder / "rank0")
    assert [(s, v) for s, v, _ in found["loss"]][:3] == [(0, 4.0), (1, 3.0), (2, 20.0)]
    assert math.isnan(found["loss"][3][1]) and found["loss"][4] == (4, 40.0, 32.0)
    assert [when for _, _, when in found["loss"]] == [10.0, 11.0, 30.0, 31.0, 32.0]
    assert [when for _, _, when in found["acc"]] == [11.0, 11.0]  # the rank's last time written before
    row = hparams_tab(tmp_path / "tb")["r"]
    assert row["finals"] == {"final/loss": 40.0, "final/acc": 0.2}
    assert row["status"] == "STATUS_FAILURE"  # no result.json: its master never wrote one


def test_exporting_again_replaces_the_earlier_export_and_nothing_else(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", {}, [(1, 1, [loss([0, 1], [1.0, 2.0], [1.0, 2.0])])], "SUCCEEDED")
    loaded = orch.load_run(run)
    folder = loaded.to_tensorboard(tmp_path / "tb")
    theirs = folder / "rank1" / "events.out.tfevents.1.host.theirs"
    theirs.write_bytes(b"")
    assert loaded.to_tensorboard(tmp_path / "tb") == folder
    assert scalars(folder / "rank1") == {"loss": [(0, 1.0, 1.0), (1, 2.0, 2.0)]}
    assert theirs.exists()
    assert len(list(folder.glob("events.out.tfevents.*"))) == 1


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../up"])
def test_a_run_name_must_be_a_folder_name(tmp_path: Path, name: str) -> None:
    run = write_run(tmp_path / "r", {}, [])
    with pytest.raises(ConfigError, match="cannot be a folder"):
        export_runs([(name, run)], tmp_path / "tb")
    assert not (tmp_path / "tb").exists()


def test_two_runs_of_one_name_are_refused(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", {}, [])
    with pytest.raises(ConfigError, match="two runs are named 'x'"):
        export_runs([("x", run), ("x", run)], tmp_path / "tb")


@pytest.mark.parametrize("missing", ["torch.utils.tensorboard", "tensorboard.plugins.hparams.summary_v2"])
def test_without_tensorboard_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    run = orch.load_run(write_run(tmp_path / "r", {}, [(0, 1, [loss([0], [1.0], [1.0])])]))
    monkeypatch.setitem(sys.modules, missing, None)  # what `import` finds for a package not installed
    with pytest.raises(ConfigError, match=r'pip install "orch\[tensorboard\]"'):
        run.to_tensorboard(tmp_path / "tb")
    assert not (tmp_path / "tb").exists()


def test_a_sweep_exports_a_folder_per_run_with_its_hparams(tmp_path: Path) -> None:
    configs = [{"lr": 0.01}, {"lr": 0.1, "fail": True}, {"lr": 0.2}]
    sweep = orch.sweep("jobs:lr_job", configs, world_size=2, run_root=str(tmp_path / "runs"), name="lr")
    sweep.wait(180)
    logdir = sweep.to_tensorboard(tmp_path / "tb")
    names = {f"{t.index}-{t.run_id}": t for t in sweep.trials}
    assert {p.name for p in logdir.iterdir()} == set(names)
    for name, trial in names.items():
        # The failed config's rank 0 may be aborted before its first beat left: only the ranks
        # whose points the log holds have a folder, and each holds exactly its logged points.
        log = logged(trial.run_dir)
        ranks = sorted({rank for rank, _ in log})
        assert {p.name for p in (logdir / name).iterdir() if p.name.startswith("rank")} == {
            f"rank{r}" for r in ranks
        }
        assert exported(logdir / name, ranks) == log
    tab = hparams_tab(logdir)
    assert {name: row["status"] for name, row in tab.items()} == {
        name: "STATUS_FAILURE" if t.state == "FAILED" else "STATUS_SUCCESS" for name, t in names.items()
    }
    results = sweep.results()
    for name, trial in names.items():
        assert tab[name]["finals"]["final/loss"] == pytest.approx(results[trial.index]["final"]["loss"])


def append_points(store: RunStore, rank: int, attempt: int, series: list[pb.Series]) -> None:
    """A beat's points into the store's metrics log, as the master appends them."""
    store.append_metrics(metric_record(rank, attempt, series))
