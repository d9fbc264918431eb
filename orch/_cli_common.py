"""What every ``orch`` command shares: one-line usage errors, the value checkers of flags that
are not launch options (those are declared in :mod:`orch.launchers.spec`), and the token
flags. It imports nothing above the worker runtime, so ``orch worker`` stays light."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path
from typing import NoReturn

from orch._text import printable
from orch.errors import ConfigError, MasterUnavailable, OrchError
from orch.runtime.target import split_target


class Parser(argparse.ArgumentParser):
    """Usage errors in one line, exit 2: what was wrong, and where to read more."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def token_options(sp: argparse.ArgumentParser, default: str) -> None:
    group = sp.add_mutually_exclusive_group()
    group.add_argument("--token", default=None, help=f"the run's secret ({default})")
    group.add_argument(
        "--token-file",
        default=None,
        metavar="PATH",
        help="read the token from this file (one line), so that it does not show in ps",
    )


def token_of(args: argparse.Namespace) -> str | None:
    """``--token``, else the first line of ``--token-file`` (kept out of ``ps``), else None."""
    if args.token_file is None:
        token: str | None = args.token
        return token
    try:
        text = Path(args.token_file).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--token-file: cannot read {args.token_file}: {e}") from e
    token = text.rstrip("\r\n")
    if not token:
        raise ConfigError(f"--token-file: {args.token_file} is empty: write the run's token into it")
    if "\n" in token:
        raise ConfigError(f"--token-file: {args.token_file} holds more than one line: write only the token")
    return token


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def target(text: str) -> str:
    """--fn's form is checked here; whether it exists, where it runs (launcher or worker)."""
    try:
        split_target(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    return text


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse ``argv`` and run its command: an error is one line on stderr and an exit code
    (2 bad usage or a refused option, 1 a failure, 130 interrupted)."""
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        code: int = args.func(args)
    except (ConfigError, MasterUnavailable, OrchError) as e:
        # The message may quote what a master or a worker sent: shown, not obeyed.
        print(f"orch {args.command}: error: {printable(str(e))}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    except KeyboardInterrupt:
        print(f"orch {args.command}: aborted", file=sys.stderr)
        return 130
    return code
