"""``orch sweep``: many runs of one function from a terminal, with a live table of the runs."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Any

from orch.errors import ConfigError
from orch.experiments.pruning import parse_prune
from orch.experiments.space import choice, grid, loguniform, randint, uniform
from orch.experiments.sweep import Sweep
from orch.experiments.sweep_plan import SweepPlan
from orch.launchers.front import RunOptions, add_flag, flagged, from_flags
from orch.launchers.spec import check_int
from orch.views.dashboard import SweepDashboard
from orch.wire.states import RunState

DIMENSIONS = {"uniform": uniform, "loguniform": loguniform, "randint": randint}


def space_from(text: str) -> dict[str, Any]:
    """``--space '{"lr": {"loguniform": [1e-4, 0.1]}, "batch": {"choice": [32, 64]}, "steps": 20}'``:
    each value a dimension (one key: uniform, loguniform, randint with [low, high], or choice
    with its options) or a fixed value."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"--space must be JSON: {e}") from e
    if not isinstance(value, dict):
        raise ConfigError(
            f'--space must be a JSON object, like {{"lr": {{"loguniform": [1e-4, 0.1]}}}}, got {text!r:.80}'
        )
    space: dict[str, Any] = {}
    for name, dim in value.items():
        if isinstance(dim, dict) and len(dim) == 1 and next(iter(dim)) in (*DIMENSIONS, "choice"):
            kind, bounds = next(iter(dim.items()))
            if kind == "choice":
                space[name] = choice(bounds)
            elif not isinstance(bounds, list) or len(bounds) != 2:
                raise ConfigError(f"--space {name}: {kind} needs [low, high], got {bounds!r:.60}")
            else:
                space[name] = DIMENSIONS[kind](*bounds)
        else:
            space[name] = dim
    return space


def configs_from(args: argparse.Namespace) -> list[dict[str, Any]] | dict[str, Any]:
    """``--grid '{"lr": [0.1, 0.01]}'`` (every combination), ``--configs '[{...}, ...]'``, or
    ``--space '{...}'`` (a search space, with ``--trials``)."""
    given = [a for a in (args.grid, args.configs, args.space) if a is not None]
    if len(given) != 1:
        raise ConfigError(
            "pass one of --grid '{\"lr\": [0.1, 0.01]}', --configs '[{\"lr\": 0.1}, ...]' or "
            '--space \'{"lr": {"loguniform": [1e-4, 0.1]}}\' --trials N'
        )
    if args.space is not None:
        return space_from(args.space)
    option, text = ("--grid", args.grid) if args.grid is not None else ("--configs", args.configs)
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{option} must be JSON: {e}") from e
    if option == "--grid":
        if not isinstance(value, dict):
            raise ConfigError(
                f'--grid must be a JSON object of lists, like {{"lr": [0.1, 0.01]}}, got {text!r:.80}'
            )
        return grid(**value)
    if not isinstance(value, list):
        raise ConfigError(f'--configs must be a JSON list of objects, like [{{"lr": 0.1}}], got {text!r:.80}')
    return value


def with_base(configs: list[Any] | dict[str, Any], base: dict[str, Any]) -> list[Any] | dict[str, Any]:
    """Each config (or the space) over the ``--config`` object every run starts from."""
    if isinstance(configs, dict):
        return {**base, **configs}
    return [{**base, **c} if isinstance(c, dict) else c for c in configs]


def cmd_sweep(args: argparse.Namespace) -> int:
    sweep = Sweep(
        SweepPlan(
            args.fn,
            with_base(configs_from(args), args.config),
            world_size=args.world_size,
            parallel=args.parallel,
            max_failures=args.max_failures,
            run_root=args.run_root,
            name=args.name,
            options=from_flags(args, RunOptions),  # type: ignore[arg-type]
            trials=args.trials,
            search=args.search,
            metric=args.metric,
            prune=parse_prune(args.prune) if args.prune else None,
            seed=args.seed,
        )
    )
    interrupted = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        # Only a flag here: stop() takes the sweep's lock, which this thread may hold right now.
        if interrupted.is_set():
            raise KeyboardInterrupt
        sys.stderr.write("\nstopping every run of the sweep (Ctrl-C again to abort)...\n")
        interrupted.set()

    def table(stop: threading.Event | None = None) -> None:
        rows = lambda: sweep.rows(args.metric)  # noqa: E731
        SweepDashboard(rows, lambda: sweep.done, metric=args.metric, interval=args.refresh).run(stop)

    with sweep:
        sweep.start()
        print(
            f"orch: sweep {sweep.name}: {len(sweep.trials)} configs, {sweep.parallel} at a time", flush=True
        )
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        table(interrupted)
        if interrupted.is_set() and not sweep.done:
            sweep.stop(reason="interrupted from the terminal")
            table()
        results = sweep.wait()
    print(repr(results), flush=True)
    states = [row["state"] for row in results]
    if any(s == RunState.FAILED.value for s in states):
        return 1
    ended = (RunState.SUCCEEDED.value, RunState.PRUNED.value)  # a pruned trial is the sweep working
    return 0 if all(s in ended for s in states) else 3


def add_parser(sub: Any, *, seconds: Any) -> None:
    """``orch sweep``'s options: the launch options as declared (orch.launchers.spec), and its own."""
    sp = sub.add_parser("sweep", help="run a function once per config, each as a run of its own")
    add_flag(sp, "fn", help="training function, as for orch run (default: the example)")
    sp.add_argument(
        "--grid", default=None, help="JSON object of lists, every combination: '{\"lr\": [0.1, 0.01]}'"
    )
    sp.add_argument("--configs", default=None, help="JSON list of config objects: '[{\"lr\": 0.1}, ...]'")
    sp.add_argument(
        "--space",
        default=None,
        help='JSON search space: \'{"lr": {"loguniform": [1e-4, 0.1]}, "batch": {"choice": [32, 64]}}\' '
        "(uniform, loguniform, randint: [low, high]; choice: options; other values fixed)",
    )
    sp.add_argument("--trials", type=_at_least(1), default=None, help="configs to draw from --space")
    sp.add_argument(
        "--search", choices=["random"], default=None, help="how --space is searched (random, seeded)"
    )
    sp.add_argument("--seed", type=int, default=0, help="the random search's seed")
    sp.add_argument(
        "--prune",
        default=None,
        help="stop trials that fall behind: asha:grace=3,reduction=3[,max_steps=N], "
        "sha:grace=3,reduction=3[,max_steps=N] or median:grace=5,interval=1,min_trials=3 (by --metric)",
    )
    add_flag(sp, "config", help="JSON object every config starts from")
    add_flag(sp, "steps", help="training steps of each run")
    add_flag(sp, "world_size", "-n", flag="--world-size", default=2, help="ranks of each run")
    sp.add_argument("--parallel", type=_at_least(1), default=1, help="runs at once (never more than fit)")
    sp.add_argument(
        "--max-failures", type=_at_least(0), default=None, help="start no more runs after N failures"
    )
    sp.add_argument("--name", default=None, help="the sweep's name (default: the function's name)")
    sp.add_argument("--metric", default="loss", help="the metric the table shows and ranks by")
    add_flag(sp, "run_root")
    add_flag(sp, "heartbeat_timeout", help="seconds before a silent rank is lost")
    for name in flagged("run"):  # every other option each run takes
        if name not in ("steps", "heartbeat_timeout"):
            add_flag(sp, name)
    sp.add_argument("--refresh", type=seconds, default=0.5, help="table refresh interval (s)")
    sp.set_defaults(func=cmd_sweep)


def _at_least(minimum: int) -> Any:
    """A count flag's type: an integer >= ``minimum``, checked as the launch options are."""

    def read(text: str) -> int:
        try:
            value = int(text)
            check_int("", value, minimum)
        except ConfigError as e:  # a ValueError too: first
            raise argparse.ArgumentTypeError(str(e).strip()) from e
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"not a valid value: {text!r}") from e
        return value

    return read
