"""What a run is to be, declared once and checked before anything starts: :class:`LaunchSpec`."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from orch.errors import ConfigError
from orch.launchers.slurm import Slurm, check_commands
from orch.runtime._target import EXAMPLE, TrainFn, resolve_fn


@dataclass
class LaunchSpec:
    """What to run and how; validated before anything starts."""

    fn: TrainFn | str | None = None
    world_size: int = 4
    config: dict[str, Any] = field(default_factory=dict)
    steps: int | None = None
    master_host: str = "127.0.0.1"
    master_port: int | None = None
    rdzv_port: int | None = None
    run_root: str = "runs"
    heartbeat_timeout: float = 30.0
    heartbeat_interval: float = 0.25
    threads: int | None = None
    poll_interval: float = 0.1
    grace: float = 1.5
    max_restarts: int = 0
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None  # default: tls_cert itself (a self-signed certificate)
    token: str | None = None  # default: $ORCH_TOKEN, else a new random one
    name: str | None = None  # what the run is called in ``orch.runs()``
    sweep: str | None = None  # the sweep it belongs to, and its config's key there
    config_key: str | None = None
    cluster: Slurm | None = None  # run on a Slurm cluster rather than on this machine
    min_world_size: int | None = None  # elastic restarts on a cluster: go on without lost nodes

    workdir: str = field(default_factory=os.getcwd)  # where workers run and find ``fn``

    def __post_init__(self) -> None:
        _check_fn(self.fn, self.workdir)
        _check_int("world_size", self.world_size, 1)
        if self.cluster is None:
            _check_fits(self.world_size)
        else:
            _check_cluster(self.cluster, self.world_size)
        if not isinstance(self.config, dict):
            raise ConfigError(
                f"config must be a dict (it reaches the function as ctx.config), got "
                f"{type(self.config).__name__} {self.config!r:.60}"
            )
        self.config = dict(self.config)  # the caller's dict stays as it was
        if self.steps is not None:
            _check_int("steps", self.steps, 1)
            self.config["steps"] = self.steps
        try:
            json.dumps(self.config, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ConfigError(
                f"config must be JSON-serialisable (numbers, strings, lists, dicts): {e}"
            ) from e
        for option in ("master_port", "rdzv_port"):
            port = getattr(self, option)
            if port is not None:
                _check_int(option, port, 0, 65535, hint="0 for any free port; leave it out for the default")
        if self.threads is not None:
            _check_int("threads", self.threads, 1)
        _check_int("max_restarts", self.max_restarts, 0)
        if self.min_world_size is not None:
            _check_int("min_world_size", self.min_world_size, 1, self.world_size)
            if self.cluster is None or self.max_restarts < 1:
                raise ConfigError(
                    "min_world_size makes restarts across nodes elastic: it needs cluster=orch.Slurm(...) "
                    "and max_restarts >= 1"
                )
        _check_seconds("heartbeat_timeout", self.heartbeat_timeout)
        _check_seconds("heartbeat_interval", self.heartbeat_interval)
        if self.heartbeat_timeout <= self.heartbeat_interval * 2:
            raise ConfigError(
                f"heartbeat_timeout={self.heartbeat_timeout:g}s must be well above the heartbeat "
                f"interval ({self.heartbeat_interval:g}s): pass a few seconds at least"
            )
        if not isinstance(self.run_root, (str, os.PathLike)):
            raise ConfigError(f"run_root must be a folder path, got {type(self.run_root).__name__}")

    @property
    def fn_name(self) -> str:
        if self.fn is None:
            return EXAMPLE
        if isinstance(self.fn, str):
            return self.fn
        return f"{getattr(self.fn, '__module__', '?')}:{getattr(self.fn, '__qualname__', '?')}"


MAX_WORKERS_PER_CORE = 8


def _check_cluster(cluster: Any, world_size: int) -> None:
    if not isinstance(cluster, Slurm):
        raise ConfigError(f"cluster must be an orch.Slurm(...), got {type(cluster).__name__}")
    if cluster.world_size != world_size:
        raise ConfigError(
            f"world_size={world_size} but the cluster runs {cluster.describe()}, {cluster.world_size} "
            f"ranks: pass world_size={cluster.world_size} or change nodes / tasks_per_node"
        )
    check_commands()


def _check_int(name: str, value: Any, minimum: int, maximum: int | None = None, *, hint: str = "") -> None:
    if type(value) is not int or value < minimum or (maximum is not None and value > maximum):
        bounds = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
        raise ConfigError(
            f"{name} must be an integer {bounds}{f' ({hint})' if hint else ''}, "
            f"got {type(value).__name__} {value!r}"
        )


def _check_seconds(name: str, value: Any) -> None:
    real = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not real or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive, finite number of seconds, got {value!r}")


def _check_fits(world_size: int) -> None:
    cores = os.cpu_count() or 1
    if world_size > MAX_WORKERS_PER_CORE * cores:
        raise ConfigError(
            f"world_size={world_size} does not fit this machine ({cores} CPU cores; at most "
            f"{MAX_WORKERS_PER_CORE * cores} local workers): pass a smaller world_size, or start "
            "`orch master` and `orch worker` on more machines"
        )


def _check_fn(fn: Any, workdir: str) -> None:
    """The training function exists and can travel to the workers, before anything starts."""
    if fn is None:
        return
    if isinstance(fn, str):
        resolve_fn(fn, workdir)
        return
    if not callable(fn):
        raise ConfigError(f"train must be a function, an import path or None, got {type(fn).__name__}")
    try:
        cloudpickle.dumps(fn)
    except Exception as e:
        name = getattr(fn, "__qualname__", repr(fn))
        raise ConfigError(
            f"the training function {name} cannot be sent to the worker processes: {e}. "
            "It must be picklable by cloudpickle: move what it closes over that cannot be pickled "
            "(an open file, a lock, a live model on a GPU) inside the function, and create it there."
        ) from e
