"""MLflow export: one MLflow run per orch run, written by this process from the run dir, read
back with ``mlflow.search_runs`` from a local file store under tmp_path (offline)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import mlflow
import numpy as np
import pytest
from mlflow.tracking import MlflowClient

import orch
from orch.record.mlflow_export import _key

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def tracking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A local MLflow file store, MLflow's default for the test; no telemetry leaves the machine."""
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store behind this
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    yield uri


def metric_points(client: MlflowClient, run_id: str, name: str) -> tuple[list[int], list[float]]:
    points = sorted(client.get_metric_history(run_id, name), key=lambda m: m.step)
    return [m.step for m in points], [m.value for m in points]


def test_a_run_is_one_mlflow_run_with_its_config_per_rank_metrics_their_mean_and_its_state(
    tmp_path: Path, tracking: str
) -> None:
    config = {"steps": 8, "lr": 0.1, "opt": {"name": "sgd", "momentum": 0.9}}
    with orch.launch("jobs:allreduce_steps", world_size=2, config=config, run_root=str(tmp_path)) as run:
        run.wait(timeout=120)
        first = run.to_mlflow(tracking_uri=tracking, experiment="exp")
        history = run.history()
    # Exported again, from the record on disk: it replaces the first, never a second run.
    again = orch.load_run(run.run_dir).to_mlflow(tracking_uri=tracking, experiment="exp")
    (found,) = mlflow.search_runs(experiment_names=["exp"], output_format="list")
    assert found.info.run_id == again != first
    assert found.info.run_name == run.run_id and found.info.status == "FINISHED"
    params = found.data.params
    assert params["lr"] == "0.1" and params["steps"] == "8" and params["world_size"] == "2"
    assert params["opt.name"] == "sgd" and params["opt.momentum"] == "0.9"
    assert params["fn"] == "jobs:allreduce_steps"
    tags = found.data.tags
    assert tags["orch.run_id"] == run.run_id and tags["orch.state"] == "SUCCEEDED"
    assert "orch.root_cause" not in tags
    client = MlflowClient(tracking)
    for rank in (0, 1):  # every point of each rank, with its step
        steps, values = metric_points(client, again, f"rank{rank}/loss")
        assert steps == list(range(8))
        assert values == pytest.approx(history["loss"][rank]["value"])
        assert metric_points(client, again, f"rank{rank}/rank_seen")[1] == [float(rank)] * 8
    steps, mean = metric_points(client, again, "loss")  # the mean over the ranks, step by step
    assert steps == list(range(8))
    assert mean == pytest.approx(np.mean([history["loss"][r]["value"] for r in (0, 1)], axis=0))
    assert history["loss"][0]["value"] != history["loss"][1]["value"]  # so the mean says something
    assert metric_points(client, again, "rank_seen")[1] == [0.5] * 8
    assert found.data.metrics["loss"] == pytest.approx(mean[-1])  # MLflow's latest value


def test_a_loss_that_went_nan_ends_nan_in_the_mean_as_in_the_sweeps_results(
    tmp_path: Path, tracking: str
) -> None:
    """The mean left NaN out, so a diverged run's ``loss`` ended at its last finite value in
    MLflow (what ``order_by=["metrics.loss"]`` ranks by), hiding the divergence."""
    with orch.launch("jobs:nan_loss", world_size=2, run_root=str(tmp_path)) as run:
        run.wait(timeout=120)
    exported = orch.load_run(run.run_dir).to_mlflow(tracking_uri=tracking, experiment="nan")
    (found,) = mlflow.search_runs(experiment_names=["nan"], output_format="list")
    assert np.isnan(found.data.metrics["loss"]) and np.isinf(found.data.metrics["other"])
    steps, values = metric_points(MlflowClient(tracking), exported, "loss")
    assert values[:2] == [1.0, 1.0] and steps[-1] >= 2 and all(np.isnan(v) for v in values[2:])


def test_a_sweep_is_one_mlflow_run_per_trial_with_the_failure_as_tags(tmp_path: Path, tracking: str) -> None:
    configs = [{"lr": 0.05, "steps": 6}, {"lr": 0.1, "steps": 6, "fail": True}]
    sweep = orch.sweep("jobs:lr_job", configs, world_size=2, parallel=2, run_root=str(tmp_path), name="lrs")
    with sweep:
        results = sweep.wait(180)
        ids = sweep.to_mlflow()  # MLFLOW_TRACKING_URI; the experiment is the sweep's name
    assert [row["state"] for row in results] == ["SUCCEEDED", "FAILED"]
    found = {r.info.run_name: r for r in mlflow.search_runs(experiment_names=["lrs"], output_format="list")}
    assert sorted(found) == ["lrs[0]", "lrs[1]"] and sorted(r.info.run_id for r in found.values()) == sorted(
        ids
    )
    ok, failed = found["lrs[0]"], found["lrs[1]"]
    assert ok.data.tags["orch.sweep"] == "lrs" and ok.data.tags["orch.state"] == "SUCCEEDED"
    assert ok.data.tags["orch.run_id"] == sweep.trials[0].run_id and ok.data.params["lr"] == "0.05"
    assert failed.info.status == "FAILED" and failed.data.tags["orch.state"] == "FAILED"
    assert "was told to fail" in failed.data.tags["orch.root_cause"]
    assert failed.data.tags["orch.root_cause_rank"] in ("0", "1")
    assert "ValueError: config lr=0.1 was told to fail" in failed.data.tags["orch.root_cause_error"]
    steps, _ = metric_points(MlflowClient(tracking), ok.info.run_id, "rank1/loss")
    assert steps == list(range(6))
    # Again: still one MLflow run per orch run.
    sweep.to_mlflow()
    assert len(mlflow.search_runs(experiment_names=["lrs"], output_format="list")) == 2


@pytest.mark.unit
def test_without_mlflow_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)  # import mlflow.tracking fails
    from orch.record.mlflow_export import export_mlflow

    with pytest.raises(orch.ConfigError, match=r"pip install \"orch\[mlflow\]\""):
        export_mlflow([("r", tmp_path)])


@pytest.mark.unit
@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("rank0/loss", "rank0/loss"),
        ("acc@1", "acc_1"),
        ("../x", "_/x"),
        ("a//b", "a/_/b"),
        ("val loss:1", "val loss:1"),
    ],
)
def test_names_mlflow_refuses_are_written_with_underscores(name: str, key: str) -> None:
    assert _key(name) == key


def test_a_run_still_going_is_not_exported(tmp_path: Path, tracking: str) -> None:
    with orch.launch("jobs:long_barriers", world_size=2, run_root=str(tmp_path)) as run:
        with pytest.raises(orch.OrchError, match=r"is still (PENDING|RUNNING): export it once it ended"):
            run.to_mlflow()
        run.stop()
        assert run.wait(timeout=120).state is orch.RunState.STOPPED
        run.to_mlflow(experiment="stopped")
    (found,) = mlflow.search_runs(experiment_names=["stopped"], output_format="list")
    assert found.info.status == "KILLED" and found.data.tags["orch.state"] == "STOPPED"
