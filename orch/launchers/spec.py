"""What a run is to be, declared once and checked before anything starts: :class:`LaunchSpec`.

Each launch option is declared once, as a field of :class:`LaunchSpec` with its default,
its check, its help text and the front doors that take it (:func:`option`); its flag too,
where the command line has one. :mod:`orch.launchers.front` is the front doors' side: the
keywords of ``orch.launch``, ``orch.sweep`` and ``orch.gang``, and the flags of ``orch run``,
``orch sweep`` and ``orch master``, built from these declarations.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import cloudpickle

from orch.errors import ConfigError
from orch.launchers.clusters import Cluster, kind_of
from orch.master.control.pace import HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT
from orch.master.control.plan import RunPlan
from orch.master.control.policies import ON_HANG
from orch.master.control.progress import STARTUP_TIMEOUT
from orch.master.control.stopping import STOP_GRACE
from orch.master.coordinator import Coordinator
from orch.record.values import VALUE_CAP
from orch.runtime._seeding import SEED_MAX
from orch.runtime.script import Script, script_target
from orch.runtime.target import EXAMPLE, TrainFn, resolve_fn, split_target

Check = Callable[[str, Any], None]  # (the option's name, its value); raises ConfigError
# Which front doors take an option as a keyword: "run", every run's (orch.launch, and each run
# of orch.sweep: RunOptions); "launch", a run's own (orch.launch only: LaunchOptions); None,
# orch's own (a positional argument, or set by orch itself).
Front = Literal["run", "launch"] | None


@dataclass(frozen=True)
class Option:
    """How a launch option is checked and read from a command line."""

    help: str
    flag: str | None = None  # its command-line spelling; None: Python only
    parse: Callable[[str], Any] | None = None  # a flag's text to a value (None: the text itself)
    check: Check | None = None  # run on a value that is not None
    front: Front = None


def option(
    default: Any = None,
    *,
    help: str,
    flag: str | None = None,
    parse: Callable[[str], Any] | None = None,
    check: Check | None = None,
    factory: Callable[[], Any] | None = None,
    front: Front = None,
) -> Any:
    """A field of :class:`LaunchSpec`, declared with everything the API and the CLI need."""
    meta = {"option": Option(help, flag, parse, check, front)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _at_least(minimum: int) -> Check:
    return lambda name, value: check_int(name, value, minimum)


def _port(name: str, value: Any) -> None:
    check_int(name, value, 0, 65535, hint="0 for any free port; leave it out for the default")


def _seconds(name: str, value: Any) -> None:
    check_seconds(name, value)


def _one_of(choices: tuple[str, ...]) -> Check:
    def check(name: str, value: Any) -> None:
        if value not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")

    return check


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"must be a JSON object, e.g. '{{\"lr\": 0.1}}': {e}") from e
    if not isinstance(value, dict):
        raise ConfigError("must be a JSON object, e.g. '{\"lr\": 0.1}'")
    return value


def _target(text: str) -> str:
    split_target(text)  # its form here; whether it exists, where it runs (launcher or worker)
    return text


@dataclass
class LaunchSpec:
    """What to run and how; validated before anything starts."""

    fn: TrainFn | str | None = option(
        help="training function as package.module:function (found from the current folder, as python "
        "-m finds it) or path/to/train.py:function (default: the built-in digits example, "
        "orch.example:train)",
        flag="--fn",
        parse=_target,
    )
    args: list[Any] | tuple[Any, ...] | None = option(
        front="run",
        help="a script's command-line arguments (with train= a script's path, such as \"train.py\", "
        "or module=): it runs as torchrun runs it, as __main__ with these in sys.argv; with a "
        "function, what each rank calls it with, fn(*args), as accelerate.notebook_launcher does "
        "(fn(ctx, *args) when its first parameter is ctx)",
    )
    module: str | None = option(
        front="run",
        help="run this module as a script in each rank, as `torchrun -m` (and `python -m`) runs it",
    )
    world_size: int = option(
        4, help="number of ranks (worker processes)", flag="--workers", parse=int, check=_at_least(1)
    )
    config: dict[str, Any] = option(
        factory=dict,
        help="JSON object passed to the function as ctx.config",
        flag="--config",
        parse=_json_object,
    )
    steps: int | None = option(
        front="run", help="training steps (sets config steps)", flag="--steps", parse=int, check=_at_least(1)
    )
    master_host: str = option(
        "127.0.0.1",
        help="address to bind (default 127.0.0.1; any other address needs a token)",
        flag="--host",
    )
    master_port: int | None = option(
        front="launch",
        help="master gRPC port (default 50051 if free, else any free port)",
        flag="--master-port",
        parse=int,
        check=_port,
    )
    rdzv_port: int | None = option(
        front="launch",
        help="torch.distributed rendezvous port (default 29500 if free, else any free port)",
        flag="--rdzv-port",
        parse=int,
        check=_port,
    )
    run_root: str = option("runs", front="launch", help="where run directories go", flag="--run-root")
    heartbeat_timeout: float = option(
        HEARTBEAT_TIMEOUT,
        front="run",
        help="seconds without a heartbeat before a rank counts as lost",
        flag="--heartbeat-timeout",
        parse=float,
        check=_seconds,
    )
    heartbeat_interval: float = option(
        HEARTBEAT_INTERVAL, help="seconds between a rank's heartbeats", check=_seconds
    )
    hang_timeout: float | None = option(
        front="run",
        help="most seconds a rank's step may stand still before the run counts as not progressing "
        "(default: 10x the usual time between its steps, at least 30)",
        flag="--hang-timeout",
        parse=float,
        check=_seconds,
    )
    on_hang: str = option(
        "warn",
        front="run",
        help="what a run that stopped progressing does: warn (tell, with every rank's stack) or fail",
        flag="--on-hang",
        check=_one_of(ON_HANG),
    )
    startup_timeout: float = option(
        STARTUP_TIMEOUT,
        front="run",
        help="seconds from the start barrier to a rank's first step before it counts as not progressing",
        flag="--startup-timeout",
        parse=float,
        check=_seconds,
    )
    stop_grace: float = option(
        STOP_GRACE,
        front="run",
        help="seconds ranks asked to stop get to reach a step boundary before they are terminated",
        flag="--stop-grace",
        parse=float,
        check=_seconds,
    )
    value_cap: int = option(
        VALUE_CAP,
        front="run",
        help="most bytes a rank's returned value may take to come back as result.value (default 1 GiB)",
        parse=int,
        check=_at_least(1),
    )
    threads: int | None = option(
        front="run",
        help="torch threads per rank (default: the cores shared out)",
        parse=int,
        check=_at_least(1),
    )
    seed: int | None = option(
        front="launch",
        help="seed every rank's torch, numpy and random generators with SEED + its rank (a run "
        "reproducible, its ranks still drawing apart); default: each rank's own, from the OS, as "
        "under torchrun",
        flag="--seed",
        parse=int,
        check=lambda name, value: check_int(name, value, 0, SEED_MAX),
    )
    poll_interval: float = option(0.1, help="seconds between the launcher's looks at its ranks")
    grace: float = option(1.5, help="seconds a rank told to end gets before it is killed")
    max_restarts: int = option(
        0,
        front="run",
        help="restart the whole group from its last checkpoint up to N times on failure",
        flag="--max-restarts",
        parse=int,
        check=_at_least(0),
    )
    tls_cert: str | None = option(
        front="launch", help="serve TLS with this certificate (PEM)", flag="--tls-cert"
    )
    tls_key: str | None = option(front="launch", help="the certificate's private key (PEM)", flag="--tls-key")
    tls_ca: str | None = option(
        front="launch", help="the CA that verifies the master (default: tls_cert itself)"
    )
    token: str | None = option(
        front="launch", help="the run's secret (default: $ORCH_TOKEN, else a new random one)"
    )
    name: str | None = option(front="launch", help="what the run is called in orch.runs()")
    sweep: str | None = option(help="the sweep the run belongs to")
    config_key: str | None = option(help="the run's config's key in its sweep")
    cluster: Cluster | None = option(
        front="launch",
        help="run on a cluster (orch.Slurm(...), or another kind's) rather than on this machine",
    )
    min_world_size: int | None = option(
        front="launch",
        help="elastic restarts: a restart goes on without hosts that fell silent while at least M "
        "ranks remain (default: every host must come back)",
        flag="--min-world-size",
        parse=int,
        check=_at_least(1),
    )
    workdir: str = option(factory=os.getcwd, help="where workers run and find the function")
    remote: bool = option(
        False,
        help="the ranks join from other machines (orch master): the function is found where they run, "
        "and the world is not held to this machine's cores",
    )

    def __post_init__(self) -> None:
        self.fn = script_target(self.fn, args=self.args, module=self.module, workdir=self.workdir)
        if not self.remote:
            _check_fn(self.fn, self.workdir)
        for f in dataclasses.fields(self):
            declared: Option | None = f.metadata.get("option")
            value = getattr(self, f.name)
            if declared is not None and declared.check is not None and value is not None:
                declared.check(f.name, value)
        if self.cluster is not None:
            _check_cluster(self.cluster, self.world_size)
        elif not self.remote:  # orch master's ranks run on the machines that join it
            _check_fits(self.world_size)
        if not isinstance(self.config, dict):
            raise ConfigError(
                f"config must be a dict (it reaches the function as ctx.config), got "
                f"{type(self.config).__name__} {self.config!r:.60}"
            )
        self.config = dict(self.config)  # the caller's dict stays as it was
        if self.steps is not None:
            self.config["steps"] = self.steps
        try:
            json.dumps(self.config, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ConfigError(
                f"config must be JSON-serialisable (numbers, strings, lists, dicts): {e}"
            ) from e
        if self.min_world_size is not None:
            check_int("min_world_size", self.min_world_size, 1, self.world_size)
            if (self.cluster is None and not self.remote) or self.max_restarts < 1:
                raise ConfigError(
                    "min_world_size makes restarts across nodes elastic: it needs a cluster "
                    "(cluster=orch.Slurm(...)) and max_restarts >= 1"
                )
        if self.heartbeat_timeout <= self.heartbeat_interval * 2:
            raise ConfigError(
                f"heartbeat_timeout={self.heartbeat_timeout:g}s must be well above the heartbeat "
                f"interval ({self.heartbeat_interval:g}s): pass a few seconds at least"
            )
        if not isinstance(self.run_root, (str, os.PathLike)):
            raise ConfigError(f"run_root must be a folder path, got {type(self.run_root).__name__}")

    def coordinator(self, *, restart_through_hosts: bool) -> Coordinator:
        """The run's master state, as this spec asks for it (a launch's and ``orch master``'s)."""
        plan = RunPlan(
            self.world_size,
            fn=self.fn_name,
            config_json=json.dumps(self.config),
            total_steps=int(self.config.get("steps", 0) or 0),
            heartbeat_timeout=self.heartbeat_timeout,
            hang_timeout=self.hang_timeout,
            on_hang=self.on_hang,
            startup_timeout=self.startup_timeout,
            stop_grace=self.stop_grace,
            heartbeat_interval=self.heartbeat_interval,
            max_attempts=self.max_restarts + 1,
            restart_through_hosts=restart_through_hosts,
            min_world_size=self.min_world_size,
            seed=self.seed,
        )
        return Coordinator(plan)

    @property
    def fn_name(self) -> str:
        if self.fn is None:
            return EXAMPLE
        if isinstance(self.fn, str):
            return self.fn
        if isinstance(self.fn, Script):
            return self.fn.describe()
        return f"{getattr(self.fn, '__module__', '?')}:{getattr(self.fn, '__qualname__', '?')}"


MAX_WORKERS_PER_CORE = 8


def _check_cluster(cluster: Any, world_size: int) -> None:
    kind = kind_of(cluster)  # a ConfigError naming the kinds there are
    if cluster.world_size != world_size:
        raise ConfigError(
            f"world_size={world_size} but the cluster runs {cluster.describe()}, {cluster.world_size} "
            f"ranks: pass world_size={cluster.world_size} or change its size"
        )
    kind.check(cluster)


def check_int(name: str, value: Any, minimum: int, maximum: int | None = None, *, hint: str = "") -> None:
    if type(value) is not int or value < minimum or (maximum is not None and value > maximum):
        bounds = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
        raise ConfigError(
            f"{name} must be an integer {bounds}{f' ({hint})' if hint else ''}, "
            f"got {type(value).__name__} {value!r}"
        )


def check_seconds(name: str, value: Any) -> None:
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


def options() -> dict[str, tuple[Option, Any]]:
    """Every declared launch option: its declaration and its default, by name."""
    out: dict[str, tuple[Option, Any]] = {}
    for f in dataclasses.fields(LaunchSpec):
        declared: Option = f.metadata["option"]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out[f.name] = (declared, default)
    return out
