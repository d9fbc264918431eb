"""Which checkpoints a run keeps, and which is its best: ``checkpoints/index.json``.

Rank 0 writes ``checkpoints/step-<step>.pt`` (:mod:`orch.runtime.checkpoints`) and, beside
the files, this index: every checkpoint kept, in the order written, with the step it was saved
at and the value of the metric it was saved with, if any::

    {"mode": "min",
     "checkpoints": [{"name": "step-000000009.pt", "step": 9, "metric": "loss", "value": 0.41}, ...]}

:func:`keep_best` decides what stays after a write: the ``keep`` best by value (the least
for ``mode="min"``, the greatest for ``"max"``), plus the newest. A checkpoint without a
value, or with a NaN or infinite one, ranks after every one with a finite value, and among
equals the newer ranks first; so without values ``keep=k`` keeps the ``k`` newest.
:func:`best_checkpoint` is ``run.best_checkpoint``: the best by that rule.

The index only ranks: the files are the truth. A file the index does not list (rank 0 died
between the two writes) counts as newer than every listed one, without a value; an entry
whose file is gone is dropped; a damaged index is read as if it were missing, with a warning.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from orch.errors import OrchError
from orch.record.owned import read_own
from orch.record.writes import write_json

log = logging.getLogger(__name__)

CHECKPOINT_NAME = re.compile(r"step-[0-9]{9,19}\.pt")  # what write_checkpoint names files (int64 steps)
INDEX = "index.json"
Mode = Literal["min", "max"]


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint on disk: ``run.best_checkpoint``. ``value`` is the metric ``metric`` at
    ``step`` (None: saved without one)."""

    path: Path
    step: int
    value: float | None = None
    metric: str = ""

    @property
    def name(self) -> str:
        return self.path.name

    def as_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "step": self.step, "value": self.value, "metric": self.metric}


def read_index(checkpoint_dir: Path) -> tuple[list[Checkpoint], Mode]:
    """The checkpoints in ``checkpoint_dir``, oldest written first, and the index's mode."""
    listed, mode = _read_listed(checkpoint_dir)
    present = {
        p.name: p
        for p in checkpoint_dir.glob("step-*.pt")
        if CHECKPOINT_NAME.fullmatch(p.name) and not p.is_symlink() and p.is_file()  # orch's own only
    }
    out = [c for c in listed if present.pop(c.name, None) is not None]
    out += [Checkpoint(path, _step_of(path.name)) for path in sorted(present.values())]
    return out, mode


def write_index(checkpoint_dir: Path, kept: list[Checkpoint], mode: Mode) -> None:
    """Write the index of ``kept`` (in the order written), atomically."""
    entries = [
        {
            "name": c.name,
            "step": c.step,
            "metric": c.metric,
            "value": c.value if c.value is not None and math.isfinite(c.value) else None,
            **({"nonfinite": repr(c.value)} if c.value is not None and not math.isfinite(c.value) else {}),
        }
        for c in kept
    ]
    write_json(checkpoint_dir / INDEX, {"mode": mode, "checkpoints": entries})


def keep_best(checkpoints: list[Checkpoint], keep: int, mode: Mode) -> list[Checkpoint]:
    """The ``keep`` best of ``checkpoints`` (oldest written first) plus the newest, in the same order."""
    if not checkpoints:
        return []
    ranked = sorted(range(len(checkpoints)), key=lambda i: _rank(checkpoints[i], i, mode))
    chosen = set(ranked[:keep]) | {len(checkpoints) - 1}
    return [c for i, c in enumerate(checkpoints) if i in chosen]


def best_checkpoint(checkpoint_dir: Path | None) -> Checkpoint | None:
    """The best checkpoint in ``checkpoint_dir`` (see the module docstring), or None when there is none."""
    if checkpoint_dir is None or not checkpoint_dir.is_dir():
        return None
    checkpoints, mode = read_index(checkpoint_dir)
    if not checkpoints:
        return None
    return min(enumerate(checkpoints), key=lambda ic: _rank(ic[1], ic[0], mode))[1]


def check_keep(keep: object, mode: object, where: str) -> None:
    """Refuse a ``keep`` that is not a count >= 1 or a ``mode`` that is not min or max."""
    if type(keep) is not int or keep < 1:
        raise ValueError(f"{where}: keep must be an integer >= 1 (checkpoints kept), got {keep!r}")
    if mode not in ("min", "max"):
        raise ValueError(
            f"{where}: mode must be 'min' or 'max' (which value of the metric is best), got {mode!r}"
        )


def _rank(c: Checkpoint, order: int, mode: Mode) -> tuple[int, float, int]:
    """Sort key, best first: a finite value by mode, then no value; newer before older."""
    if c.value is None or not math.isfinite(c.value):
        return (1, 0.0, -order)
    return (0, c.value if mode == "min" else -c.value, -order)


def _step_of(name: str) -> int:
    return int(name[len("step-") : -len(".pt")])


def _read_listed(checkpoint_dir: Path) -> tuple[list[Checkpoint], Mode]:
    """The index's entries (validated), or none when it is missing or damaged (with a warning)."""
    path = checkpoint_dir / INDEX
    try:
        data = json.loads(read_own(path))
        mode = data.get("mode", "min")
        if mode not in ("min", "max"):
            raise ValueError(f"mode {mode!r}")
        out = []
        for entry in data["checkpoints"]:
            name, step, metric = entry["name"], entry["step"], entry.get("metric", "")
            value = entry.get("value")
            if "nonfinite" in entry:
                value = float(entry["nonfinite"])
            if not isinstance(name, str) or not CHECKPOINT_NAME.fullmatch(name) or _step_of(name) != step:
                raise ValueError(f"entry {entry!r:.80} names no checkpoint file")
            if not isinstance(metric, str) or not (value is None or isinstance(value, int | float)):
                raise ValueError(f"entry {entry!r:.80} has no metric name or no number")
            out.append(
                Checkpoint(checkpoint_dir / name, step, None if value is None else float(value), metric)
            )
        return out, mode
    except FileNotFoundError:
        return [], "min"
    except (OrchError, OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        log.warning("%s is damaged (%s): ranking the checkpoints there as if none had a value", path, e)
        return [], "min"
