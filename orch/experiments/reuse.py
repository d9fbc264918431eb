"""When two runs are the same config of a sweep, and which earlier runs a sweep reuses.

A config's key (:func:`config_key`) is a hash of its function's name and code
(:func:`code_hash`), its world size and its config, ``1`` and ``1.0`` counted as one value.
Each run of a sweep writes its key into ``run.json``; :func:`reuse_earlier` finds the runs
under the run root that succeeded (or were pruned) under the sweep's name with a key of its
configs, so that running the same sweep cell again starts only the configs that did not end
before; and each of those that an earlier run left unfinished (stopped, or cut off by the
death of its kernel: no record of its end) starts from that run's newest checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orch._version import __version__
from orch.errors import OrchError
from orch.experiments.trial import Trial
from orch.launchers.loaded import load_run
from orch.record.owned import is_own_dir
from orch.record.rundir import read_json
from orch.record.writes import own_dir, private_dir, write_json
from orch.runtime.script import Script
from orch.runtime.target import resolve_fn
from orch.wire.states import RunState

log = logging.getLogger("orch.experiments.sweep")  # the sweep's messages, under the one name


def _same_numbers(value: Any) -> Any:
    """``1`` and ``1.0`` are one config value (a JSON config cannot tell them apart reliably)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        return {str(k): _same_numbers(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_same_numbers(v) for v in value]
    return value


def code_hash(fn: Any, fn_name: str, workdir: str) -> str:
    """What the function's code is, as far as it can be read: its source, else its pickle.

    A config that succeeded with other code (a bug fixed in the cell since) is not reused.
    """
    import inspect

    if fn is None:
        return f"orch {__version__}"
    if isinstance(fn, Script):  # its file's text
        return fn.code()[:16]
    try:
        target = resolve_fn(fn, workdir) if isinstance(fn, str) else fn
        text = inspect.getsource(target)
    except (OSError, TypeError, OrchError):
        import cloudpickle

        try:
            text = cloudpickle.dumps(fn).hex()
        except Exception:  # it was checked to pickle already; a name is the last resort
            text = fn_name
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_key(fn_name: str, config: dict[str, Any], world_size: int = 0, code: str = "") -> str:
    """What identifies a run of a sweep: its function (name and code), world size and config."""
    text = json.dumps(
        {"fn": fn_name, "code": code, "world_size": world_size, "config": _same_numbers(config)},
        sort_keys=True,
        allow_nan=False,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


KEPT = (RunState.SUCCEEDED.value, RunState.PRUNED.value)  # an earlier run that ended for good


def reuse_earlier(trials: Sequence[Trial], run_root: Path, name: str) -> None:
    """Configs that already succeeded (or were pruned) under the sweep's ``name`` are not run
    again: each such trial adopts its earlier run (:meth:`Trial.adopt`). Each other config
    whose newest earlier run was left unfinished with a checkpoint resumes from it
    (``Trial.resume_from``)."""
    by_key = {t.key: t for t in trials}
    if not run_root.is_dir():
        return
    unfinished: dict[str, tuple[float, Path]] = {}
    for run_dir in sorted(run_root.iterdir()):
        if not is_own_dir(run_dir):
            continue  # a run dir another user planted in a shared run root is no earlier run
        meta_path, result_path = run_dir / "run.json", run_dir / "result.json"
        if not meta_path.is_file():
            continue
        try:
            meta = read_json(meta_path)
            result = read_json(result_path) if result_path.is_file() else {}
        except OrchError:
            continue  # a damaged record is not a success to build on: the config runs again
        key = str(meta.get("config_key", ""))
        trial = by_key.get(key)
        if meta.get("sweep") != name or trial is None:
            continue
        state = result.get("state")
        started_at = meta.get("started")
        when = float(started_at) if isinstance(started_at, (int, float)) else 0.0
        # Unfinished: no record of its end (its kernel died), stopped, or closed from outside
        # while it ran (a kernel restarted, sweep.close()): not a failure of its own.
        events = result.get("events", [])
        closed = state == RunState.FAILED.value and any(e.get("kind") == "closed" for e in events)
        unfinished_run = state in (None, RunState.STOPPED.value) or closed
        resumable = unfinished_run and (run_dir / "checkpoints" / "latest").is_file()
        if resumable and when >= unfinished.get(key, (-1.0, run_dir))[0]:
            unfinished[key] = (when, run_dir / "checkpoints")
        if state not in KEPT or trial.reused:
            continue
        try:
            loaded = load_run(run_dir)  # a record that does not load is run again
        except OrchError as e:
            log.warning(
                "sweep %s: %s does not load (%s): config %d runs again",
                name,
                run_dir,
                e,
                trial.index,
            )
            continue
        value = meta.get("started")
        started = float(value) if isinstance(value, (int, float)) else 0.0
        # Launch to record, as for the runs the sweep starts.
        duration = max(0.0, result_path.stat().st_mtime - started) if started else 0.0
        trial.adopt(run_dir, loaded, str(state), started, duration)
    for key, (_, checkpoints) in unfinished.items():
        trial = by_key[key]
        if not trial.reused:
            trial.resume_from = checkpoints


def read_record(folder: Path) -> dict[str, Any]:
    """The sweep's folder's ``sweep.json`` as an earlier run of the sweep left it ({} when none,
    or when it does not read: the sweep then starts its search afresh, saying so)."""
    path = folder / "sweep.json"
    if not path.is_file():
        return {}
    try:
        return read_json(path)
    except OrchError as e:
        log.warning("sweep %s: %s does not read (%s): its search starts afresh", folder.name, path, e)
        return {}


def write_record(folder: Path, record: dict[str, Any]) -> None:
    """Write ``sweep.json`` (how each trial stands, the pruner's rungs) into the sweep's folder."""
    private_dir(folder.parent)
    private_dir(folder)
    write_json(folder / "sweep.json", record)


def signature(
    fn_name: str,
    code: str,
    world_size: int,
    space: Any,
    search: Any,
    seed: int,
    metric: str,
    mode: str,
    prune: Any,
    steps: int | None,
) -> str:
    """What makes a rerun of a sweep the same search: its function (name and code), world size,
    space, search, metric and pruner. A rerun with another goes on in a folder of its own."""

    def described(value: Any) -> Any:
        describe = getattr(value, "describe", None)
        return describe() if callable(describe) else value

    shown = {k: described(v) for k, v in space.items()} if isinstance(space, dict) else list(space)
    searched = search if search is None or isinstance(search, str) else type(search).__qualname__
    pruned = None if prune is None else type(prune).__qualname__
    if type(prune).__module__.startswith("orch"):
        pruned = repr(prune)  # its options too
    text = json.dumps(
        {
            "fn": fn_name, "code": code, "world_size": world_size, "space": shown, "search": searched,
            "seed": seed, "metric": metric, "mode": mode, "prune": pruned, "steps": steps,
        },
        sort_keys=True,
        default=repr,
    )  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def set_aside(folder: Path) -> Path:
    """Move a sweep's folder out of the way (``<name>.<unix time>``), keeping what it holds."""
    aside = folder.with_name(f"{folder.name}.{int(time.time() * 1000)}")
    with own_dir(folder.parent) as sweeps:
        sweeps.move(folder.name, aside.name)
    return aside
