"""What a sweep makes of a logged metric: its curve over the ranks, and which way is better.

:func:`summarize` folds one metric's points from every rank into a mean (and a min-max band)
per step; :func:`default_mode` says whether a metric is best at its greatest or its least.
A trial's row of the results, :meth:`Sweep.best`, the dashboard's rows and the notebook
views all rank runs by these two, so they live apart from any of them.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

# Metrics that grow as a model gets better; any other metric is best at its least.
GREATER_IS_BETTER = ("acc", "accuracy", "auc", "f1", "precision", "recall", "score", "reward", "iou", "bleu")


def default_mode(metric: str) -> Literal["min", "max"]:
    """``"max"`` for a metric named like an accuracy or a score (``val_acc``, ``f1``), else ``"min"``."""
    words = metric.lower().replace("-", "_").replace("/", "_").split("_")
    return "max" if any(w in GREATER_IS_BETTER for w in words) else "min"


def summarize(by_rank: dict[int, dict[str, list[float]]]) -> tuple[Any, Any, Any, Any]:
    """A metric over ranks, step by step: ``(steps, mean, min, max)`` as numpy arrays.

    A step counts every rank that logged it; NaN and inf points are left out of the mean.
    """
    empty = np.empty(0)
    if not by_rank:
        return empty.astype(np.int64), empty, empty, empty
    steps = np.concatenate([np.asarray(s["step"], dtype=np.int64) for s in by_rank.values()])
    values = np.concatenate([np.asarray(s["value"], dtype=np.float64) for s in by_rank.values()])
    finite = np.isfinite(values)
    steps, values = steps[finite], values[finite]
    if len(steps) == 0:
        return empty.astype(np.int64), empty, empty, empty
    order = np.argsort(steps, kind="stable")
    steps, values = steps[order], values[order]
    unique, start = np.unique(steps, return_index=True)
    mean = np.add.reduceat(values, start) / np.diff(np.append(start, len(values)))
    return unique, mean, np.minimum.reduceat(values, start), np.maximum.reduceat(values, start)


def last_value(by_rank: dict[int, dict[str, list[float]]]) -> float | None:
    """The metric's final value: the mean over the ranks of what they logged at the last step
    any of them logged, NaN and inf included (a run whose loss ended NaN ends NaN, whatever
    it was before). None: no point at all."""
    steps = [s["step"][-1] for s in by_rank.values() if s["step"]]
    if not steps:
        return None
    last = max(steps)
    values = [s["value"][-1] for s in by_rank.values() if s["step"] and s["step"][-1] == last]
    with np.errstate(all="ignore"):
        return float(np.mean(values))


def nonfinite(by_rank: dict[int, dict[str, list[float]]]) -> dict[str, Any] | None:
    """Where the metric first became NaN or inf on any rank: ``{"step", "rank", "value",
    "last_finite", "last_finite_step", "stays"}`` (the last finite value over the ranks' points
    and its step; ``stays``: some rank's last value is not finite, so the mean over the ranks
    ends NaN or inf). None: always finite."""
    first: dict[str, Any] | None = None
    stays = False
    for rank, s in sorted(by_rank.items()):
        values = np.asarray(s["value"], dtype=np.float64)
        finite = np.isfinite(values)
        if finite.all():
            continue
        stays = stays or not finite[-1]
        i = int(np.argmin(finite))
        step = int(s["step"][i])
        if first is None or step < first["step"]:
            j = len(values) - 1 - int(np.argmax(finite[::-1])) if finite.any() else -1
            first = {
                "step": step,
                "rank": rank,
                "value": float(values[i]),
                "last_finite": float(values[j]) if j >= 0 else None,
                "last_finite_step": int(s["step"][j]) if j >= 0 else -1,
            }
    if first is not None:
        first["stays"] = stays
    return first
