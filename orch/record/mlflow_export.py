"""MLflow runs from run directories: ``run.to_mlflow()``, ``sweep.to_mlflow()``.

One MLflow run per orch run, written from its run dir by the process that asks (the notebook
that launched it, or any that loads it), never by the ranks: the ranks of a DDP job are one
run, and a tracker run per rank would split it. :func:`export_mlflow` writes, for each run::

    params     the config (nested keys joined by dots), fn, world_size
    metrics    rank<N>/<metric>   each rank's points, with their steps and the wall times they
                                  were logged at (a restart's replayed steps replace the older
                                  attempt's, as in to_csv)
               <metric>           the mean over the ranks that logged the step (NaN and inf
                                  left out, as a sweep's results; a step where every rank's
                                  value is NaN or inf is NaN or inf, so a diverged run ends
                                  so); not for orch's own rank/ metrics
    tags       orch.run_id, orch.state, orch.root_cause (why it failed), orch.root_cause_rank,
               orch.root_cause_error (the traceback), orch.world_size, orch.fn, orch.run_dir,
               orch.attempts, and orch.sweep and orch.name for a sweep's runs
    status     FINISHED for SUCCEEDED, FAILED, KILLED for STOPPED; start and end times the run's

Why ``rank0/loss`` and not ``loss/rank0``: MLflow's file store keeps each metric in a file
named after it, so ``loss`` and ``loss/rank0`` cannot both exist there (``loss`` would be a file
and a folder). Ranks first leave the metric's own name to the mean, the figure a sweep ranks
its configs by (``order_by=["metrics.loss"]``). A name MLflow refuses (it takes letters,
digits, ``_ - . / :`` and spaces) has its other characters written as ``_``.

Exporting a run again replaces the MLflow run of the same ``orch.run_id`` in that experiment
(the old one is deleted), so there is one MLflow run per orch run however often it is exported.
Needs the MLflow client: ``pip install "orch[mlflow]"`` (``mlflow-skinny``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orch.errors import ConfigError, OrchError
from orch.record.tensorboard import Exportable, flatten_config, kept_points
from orch.record.writes import private_store
from orch.wire.limits import OWN_METRICS
from orch.wire.states import RunState

if TYPE_CHECKING:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

INSTALL = 'MLflow export needs the MLflow client: pip install "orch[mlflow]"'
_STATUS = {RunState.SUCCEEDED: "FINISHED", RunState.FAILED: "FAILED", RunState.STOPPED: "KILLED"}
_BATCH = 1000  # MLflow's most metrics in one log_batch
_PARAMS_BATCH = 100  # and params
_KEY_LEN = 250  # the longest name MLflow takes
_TAG_LEN = 8000  # the longest tag value
_BAD = re.compile(r"[^\w\-. /:]")


def export_mlflow(
    runs: Iterable[tuple[str, Exportable | str | os.PathLike[str]]],
    *,
    tracking_uri: str | None = None,
    experiment: str = "orch",
    load: Callable[[Path], Exportable] | None = None,
) -> list[str]:
    """Write each ``(name, run)`` (a loaded run, or its run dir read by ``load``) as one MLflow
    run named ``name`` in ``experiment`` (made if missing) at ``tracking_uri`` (None: MLflow's
    own, ``MLFLOW_TRACKING_URI``); returns the MLflow run ids, in order. A run dir is loaded
    when its turn comes, so one run is in memory at a time."""
    client = _client(tracking_uri)
    if not isinstance(experiment, str) or not experiment.strip():
        raise ConfigError(f"experiment must be a non-empty name, got {experiment!r}")
    experiment_id = _experiment_id(client, experiment)
    ids = []
    for name, run in list(runs):
        if isinstance(run, (str, os.PathLike)):
            if load is None:
                raise TypeError(f"run {name!r} is a path: pass load=orch.load_run to read it")
            run = load(Path(run))
        ids.append(_export_run(client, experiment_id, name, run))
    return ids


def _client(tracking_uri: str | None) -> MlflowClient:
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as e:
        raise ConfigError(INSTALL) from e
    if tracking_uri is not None and not isinstance(tracking_uri, str):
        raise ConfigError(
            f"tracking_uri must be a URI string (file:///path/mlruns, http://host:5000), got {tracking_uri!r}"
        )
    if tracking_uri is None:
        # MLflow's default store is ./mlflow.db, made with the usual mode (0644): readable by
        # every user of the host, and a run's tracebacks go into it. Made 0600 here first.
        import mlflow

        default = mlflow.get_tracking_uri()
        if default.startswith("sqlite:///"):
            private_store(default[len("sqlite:///") :])
    return MlflowClient(tracking_uri=tracking_uri)


def _experiment_id(client: MlflowClient, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is None:
        return str(client.create_experiment(name))
    if found.lifecycle_stage != "active":
        raise OrchError(
            f"MLflow experiment {name!r} is deleted: restore it (MlflowClient().restore_experiment"
            f"({found.experiment_id!r})) or pass another experiment="
        )
    return str(found.experiment_id)


def _export_run(client: MlflowClient, experiment_id: str, name: str, run: Exportable) -> str:
    from mlflow.entities import Metric, Param

    meta, mirror = run.meta, run.state()
    run_id = mirror.run_id or run.run_dir.name
    _delete_earlier(client, experiment_id, run_id)
    started = meta.get("started")
    start = float(started) if isinstance(started, int | float) and not isinstance(started, bool) else 0.0
    tags = _tags(meta, mirror, run.run_dir)
    created = client.create_run(
        experiment_id, start_time=_ms(start) if start else None, tags=tags, run_name=name
    )
    mlflow_id = str(created.info.run_id)
    params = [Param(_key(k), str(v)) for k, v in _params(meta, mirror.world_size).items()]
    for i in range(0, len(params), _PARAMS_BATCH):
        client.log_batch(mlflow_id, params=params[i : i + _PARAMS_BATCH])
    batch: list[Metric] = []
    # (metric, step): [sum of finite values, their count, last time, sum of the others]
    means: dict[tuple[str, int], list[float]] = {}
    last = start
    for rank, points in kept_points(run.run_dir / "metrics.pb"):
        for step, metric, value, when in points:
            when = when if when is not None else start
            last = max(last, when)
            batch.append(Metric(_key(f"rank{rank}/{metric}"), value, _ms(when), step))
            if len(batch) == _BATCH:
                client.log_batch(mlflow_id, metrics=batch)
                batch = []
            if not metric.startswith(OWN_METRICS):
                held = means.setdefault((metric, step), [0.0, 0.0, when, 0.0])
                if math.isfinite(value):
                    held[0] += value
                    held[1] += 1
                else:
                    held[3] += value  # nan; inf, -inf, or nan for both
                held[2] = max(held[2], when)
    for (metric, step), (total, count, when, others) in sorted(means.items()):
        # A step with no finite value is NaN or inf in the mean too: a run whose loss went NaN
        # ends NaN, as in a sweep's results, never at its last finite value.
        batch.append(Metric(_key(metric), total / count if count else others, _ms(when), step))
        if len(batch) == _BATCH:
            client.log_batch(mlflow_id, metrics=batch)
            batch = []
    if batch:
        client.log_batch(mlflow_id, metrics=batch)
    end = start + mirror.elapsed if start and mirror.elapsed else last
    client.set_terminated(
        mlflow_id, status=_STATUS.get(mirror.state, "FAILED"), end_time=_ms(end) if end else None
    )
    return mlflow_id


def _delete_earlier(client: MlflowClient, experiment_id: str, run_id: str) -> None:
    """Delete the MLflow runs an earlier export of this orch run made in the experiment."""
    quoted = run_id.replace("\\", "\\\\").replace("'", "\\'")
    for earlier in client.search_runs([experiment_id], filter_string=f"tags.`orch.run_id` = '{quoted}'"):
        client.delete_run(earlier.info.run_id)


def _tags(meta: dict[str, Any], mirror: Any, run_dir: Path) -> dict[str, str]:
    tags = {
        "orch.run_id": mirror.run_id or run_dir.name,
        "orch.state": mirror.state.value,
        "orch.world_size": str(mirror.world_size),
        "orch.fn": str(meta.get("fn", "")),
        "orch.run_dir": str(run_dir.resolve()),
        "orch.attempts": str(mirror.attempt),
    }
    for key in ("sweep", "name"):
        if isinstance(meta.get(key), str):
            tags[f"orch.{key}"] = meta[key]
    if mirror.failure:
        tags["orch.root_cause"] = _cut(mirror.failure)
    if mirror.root_cause_rank >= 0:
        tags["orch.root_cause_rank"] = str(mirror.root_cause_rank)
    if mirror.root_cause_error:
        tags["orch.root_cause_error"] = _cut(mirror.root_cause_error)
    return tags


def _params(meta: dict[str, Any], world_size: int) -> dict[str, Any]:
    params: dict[str, Any] = {"fn": str(meta.get("fn", "")), "world_size": world_size}
    config = meta.get("config")
    for key, setting in flatten_config("", config if isinstance(config, dict) else {}):
        params[f"config.{key}" if key in ("fn", "world_size") else key] = setting
    return params


def _key(name: str) -> str:
    """``name`` as a metric or param name MLflow takes (see the module docstring)."""
    parts = [p if p not in ("", ".", "..") else "_" for p in _BAD.sub("_", name).split("/")]
    return "/".join(parts)[:_KEY_LEN]


def _cut(text: str) -> str:
    """A tag value within MLflow's limit: its end kept, where a traceback names the error."""
    return text if len(text) <= _TAG_LEN else "..." + text[-(_TAG_LEN - 3) :]


def _ms(seconds: float) -> int:
    return int(seconds * 1000)
