"""``orch runs``, ``orch show`` and ``orch logs``: the run dirs on disk, read from a terminal
(see :mod:`orch.experiments.catalog`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from orch._text import printable
from orch.errors import ConfigError, OrchError
from orch.experiments.run_detail import describe, find_run, rank_log
from orch.experiments.run_row import CRASHED, read_row
from orch.experiments.run_table import runs
from orch.record.owned import MAX_LINE_BYTES, open_own, read_line


def add_parsers(sub: Any) -> None:
    """The three commands' options."""

    def run_root(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--run-root", default="runs", help="where the run directories are (default runs)")

    def run_arg(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("run", metavar="RUN", help="a run id under --run-root (or its start), or a run dir")

    ls = sub.add_parser("runs", help="list the runs under --run-root, newest first")
    run_root(ls)
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.add_argument("--state", default=None, type=str.upper, help="only the runs in this state")
    ls.add_argument("--sweep", default=None, help="only the runs of this sweep")
    ls.set_defaults(func=cmd_runs)

    sh = sub.add_parser("show", help="one run: its config, attempts, ranks and root cause")
    run_arg(sh)
    run_root(sh)
    sh.set_defaults(func=cmd_show)

    lg = sub.add_parser("logs", help="a worker's log of a run")
    run_arg(lg)
    lg.add_argument("--rank", type=_rank, default=0, help="whose log (default rank 0)")
    lg.add_argument("--follow", "-f", action="store_true", help="print what comes until the run ends")
    run_root(lg)
    lg.set_defaults(func=cmd_logs)


def cmd_runs(args: argparse.Namespace) -> int:
    table = runs(args.run_root).filter(state=args.state, sweep=args.sweep)
    if args.json:
        print(json.dumps(table.as_dicts(), indent=2))
    else:
        print(repr(table))  # every cell went through printable
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    print(describe(read_row(find_run(args.run, args.run_root))))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    run_dir = find_run(args.run, args.run_root)
    world_size = read_row(run_dir).world_size
    if world_size and args.rank >= world_size:  # a bad argument, as every other one: exit 2
        raise ConfigError(
            f"--rank {args.rank}: run {run_dir.name} has {world_size} rank{'s' if world_size > 1 else ''}"
            f" (0 to {world_size - 1})"
        )
    if args.follow:
        return _follow_log(run_dir, args.rank)
    path = rank_log(run_dir, args.rank)
    if path is None or not path.is_file():
        logs = sorted(p.name for p in (run_dir / "logs").glob("*.log"))
        why = f"rank {args.rank} has not registered" if path is None else f"{path} does not exist"
        raise OrchError(
            f"no log for rank {args.rank} of run {run_dir.name}: {why}; "
            + (f"{run_dir}/logs holds {', '.join(logs)}" if logs else f"{run_dir}/logs is empty")
        )
    with open_own(path) as f:  # a regular file of this user's: never a FIFO or a device
        while True:
            line, cut = read_line(f)  # a line past MAX_LINE_BYTES is cut, never held whole
            if not line:
                break
            sys.stdout.write(printable(line.decode("utf-8", "replace")))
            if cut:
                sys.stdout.write(f"[{cut:,} more bytes of this line not shown]\n")
    sys.stdout.flush()
    return 0


def _follow_log(run_dir: Path, rank: int, interval: float = 0.25) -> int:
    """Print the rank's log as it grows, until the run ended (or crashed) or Ctrl-C.

    A restart gives the rank a new worker and log: the newest registration is followed.
    Lines are printed whole, so that no escape sequence is split between two reads.
    """
    current: Path | None = None
    position, partial, events_size = 0, b"", -1

    def flush(text: bytes) -> None:
        sys.stdout.write(printable(text.decode("utf-8", "replace")))
        sys.stdout.flush()

    try:
        while True:
            # Whether it ended is decided before the last read, so that read sees everything.
            ended = (run_dir / "result.json").exists() or read_row(run_dir).state == CRASHED
            size = _size(run_dir / "events.jsonl")
            if size != events_size or current is None or ended:
                events_size = size
                path = rank_log(run_dir, rank)
                if path is not None and path != current:
                    if current is not None:
                        flush(partial)
                        partial = b""
                        print(f"--- rank {rank} restarted: {path.name} ---", flush=True)
                    current, position = path, 0
            if current is not None:
                with contextlib.suppress(FileNotFoundError), open_own(current) as f:
                    f.seek(position)
                    data = f.read(MAX_LINE_BYTES)  # a read at a time: memory stays bounded
                    position += len(data)
                    *lines, partial = (partial + data).split(b"\n")
                    if lines:
                        flush(b"\n".join(lines) + b"\n")
                    if len(partial) >= MAX_LINE_BYTES:  # a line that long is shown in pieces
                        flush(partial + b"\n")
                        partial = b""
                    if len(data) == MAX_LINE_BYTES:
                        continue  # more is waiting: read it before sleeping
            if ended:
                flush(partial)
                return 0
            time.sleep(interval)
    except KeyboardInterrupt:
        flush(partial)
        return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _rank(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a rank (0, 1, ...), got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value
