"""The run directory ``runs/<run-id>/``: worker logs, and the run's final record."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from .client import StateMirror
from .coordinator import Coordinator


def _jsonable(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def write_result(coordinator: Coordinator, run_dir: Path) -> Path:
    """Write ``result.json``: the final state, per-rank series and events (atomically)."""
    mirror = StateMirror()
    mirror.apply(coordinator.snapshot())
    record: dict[str, Any] = mirror.as_dict()
    record["history"] = {
        f"{rank}/{name}": {"step": buf.steps.tolist(), "value": [_jsonable(v) for v in buf.values.tolist()]}
        for (rank, name), buf in sorted(mirror.series.items())
    }
    record["events"] = [
        {"time": t, "kind": kind, "rank": rank, "message": msg} for t, kind, rank, msg in mirror.events
    ]
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "result.json"
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path
