"""The ranks' own output in the terminal of ``orch run``, as ``torchrun`` shows it.

A rank's stdout and stderr go to its log in the run dir (``logs/<worker id>.log``); ``orch run``
follows those files and prints what the chosen ranks write (rank 0 by default; ``--output
all``, ``--output none`` or ``--output 0,3``), above the live dashboard on a terminal and
between its lines elsewhere. A line rewritten with ``\\r`` (a tqdm bar) is printed once, in its
last state, when it ends; orch's own INFO lines in the log stay in the log. With more than one
rank shown, each line is prefixed ``[rank3]:`` (torchrun's ``--tee`` words).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from orch._text import printable
from orch.errors import OrchError
from orch.record.owned import open_own
from orch.record.store import shown_lines

MAX_READ = 1 << 20  # bytes read from one log per look: a flood is shown in pieces, not all at once


def parse_ranks(text: str) -> frozenset[int] | None:
    """``--output``'s value: ``all`` (None), ``none`` (no rank), or ranks ``0,3``."""
    if text == "all":
        return None
    if text == "none":
        return frozenset()
    try:
        ranks = frozenset(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected all, none or ranks such as 0,3; got {text!r}") from None
    if any(r < 0 for r in ranks):
        raise argparse.ArgumentTypeError(f"ranks are >= 0, got {text!r}")
    return ranks


class OutputFollower:
    """New complete lines of the shown ranks' logs since the last look.

    ``ranks()`` gives the run's (rank, worker id) pairs as the master knows them; ``shown``
    the ranks to follow (None: all).
    """

    def __init__(
        self, logs: Path, ranks: Callable[[], Iterable[tuple[int, str]]], shown: frozenset[int] | None
    ) -> None:
        self.logs = logs
        self.ranks = ranks
        self.shown = shown
        self._offsets: dict[str, int] = {}
        self._partial: dict[str, str] = {}

    def lines(self) -> list[str]:
        if self.shown is not None and not self.shown:
            return []
        chosen = [(r, w) for r, w in self.ranks() if self.shown is None or r in self.shown]
        prefix = self.shown is None or len(self.shown) > 1
        out = []
        for rank, worker_id in sorted(chosen):
            for line in self._new(worker_id):
                shown = printable(line, one_line=True)
                out.append(f"[rank{rank}]: {shown}" if prefix else shown)
        return out

    def _new(self, worker_id: str) -> list[str]:
        path = self.logs / f"{worker_id}.log"
        at = self._offsets.get(worker_id, 0)
        try:
            with open_own(path) as f:
                f.seek(at)
                data = f.read(MAX_READ)
        except (OSError, OrchError):
            return []
        self._offsets[worker_id] = at + len(data)
        text = self._partial.pop(worker_id, "") + data.decode(errors="replace")
        head, newline, rest = text.rpartition("\n")
        if rest:
            self._partial[worker_id] = rest  # a line not ended yet (a bar still moving)
        if not newline:
            return []
        own = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} " + re.escape(worker_id) + " INFO ")
        return [line for line in shown_lines(head) if not own.match(line)]
