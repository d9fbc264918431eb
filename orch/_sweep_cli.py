"""``orch sweep``: many runs of one function from a terminal, with a live table of the runs."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Any

from orch.errors import ConfigError
from orch.experiments.sweep import Sweep, _Options, grid
from orch.launchers.spec import add_flag, check_int
from orch.views.dashboard import SweepDashboard
from orch.wire.states import RunState


def configs_from(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--grid '{"lr": [0.1, 0.01]}'`` (every combination) or ``--configs '[{...}, ...]'``."""
    if (args.grid is None) == (args.configs is None):
        raise ConfigError("pass one of --grid '{\"lr\": [0.1, 0.01]}' or --configs '[{\"lr\": 0.1}, ...]'")
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


def with_base(configs: list[Any], base: dict[str, Any]) -> list[Any]:
    """Each config over the ``--config`` object every run starts from."""
    return [{**base, **c} if isinstance(c, dict) else c for c in configs]


def cmd_sweep(args: argparse.Namespace) -> int:
    sweep = Sweep(
        args.fn,
        with_base(configs_from(args), args.config),
        world_size=args.world_size,
        parallel=args.parallel,
        max_failures=args.max_failures,
        run_root=args.run_root,
        name=args.name,
        options=_Options(steps=args.steps, heartbeat_timeout=args.heartbeat_timeout),
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
    return 0 if all(s == RunState.SUCCEEDED.value for s in states) else 3


def add_parser(sub: Any, *, seconds: Any) -> None:
    """``orch sweep``'s options: the launch options as declared (orch.launchers.spec), and its own."""
    sp = sub.add_parser("sweep", help="run a function once per config, each as a run of its own")
    add_flag(sp, "fn", help="training function, as for orch run (default: the example)")
    sp.add_argument(
        "--grid", default=None, help="JSON object of lists, every combination: '{\"lr\": [0.1, 0.01]}'"
    )
    sp.add_argument("--configs", default=None, help="JSON list of config objects: '[{\"lr\": 0.1}, ...]'")
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
