"""What a sweep found: the results table, the best config, the dashboard's rows.

:class:`SweepResults` is :meth:`Sweep.results`: a row per config (from :meth:`Trial.summary`),
sortable by a metric, shown as text or as an HTML table in a notebook. :func:`best_trial` is
:meth:`Sweep.best` and :func:`dashboard_rows` is :meth:`Sweep.rows`, what ``orch sweep``'s
terminal dashboard draws. All of them read trials and rows; none starts or stops a run.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from orch._text import escape_html, nonfinite_words, value_text
from orch.errors import ConfigError, OrchError
from orch.experiments.metrics import default_mode
from orch.experiments.trial import CANCELLED, Trial
from orch.wire.limits import OWN_METRICS
from orch.wire.states import RunState


class SweepResults:
    """:meth:`Sweep.results`: a row per config; an HTML table in a notebook."""

    def __init__(self, rows: list[dict[str, Any]], name: str) -> None:
        self.rows = rows
        self.name = name

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]

    def metrics(self) -> list[str]:
        return sorted({m for row in self.rows for m in row["final"]})

    def sorted(self, metric: str = "loss", mode: Literal["min", "max"] = "min") -> SweepResults:
        """The rows by the final value of ``metric``, best first; then those whose value ended
        NaN or inf, or that never logged it; the FAILED and CANCELLED configs last of all."""
        sign = -1.0 if mode == "max" else 1.0
        return SweepResults(sorted(self.rows, key=lambda row: _order(row, metric, sign)), self.name)

    def table(self) -> tuple[list[str], list[list[str]]]:
        """Column names and the rows as text: config values, then state, step, time, metrics.
        A pruned config's step is its rung; a metric's last value logged before the run's last
        step (an evaluation every 50 steps, a config pruned before the next) names its step."""
        keys = sorted({k for row in self.rows for k in row["config"]})
        metrics = self.metrics()
        head = ["#", *keys, "state", "step", "wall time"]
        for m in metrics:
            head += [f"{m} last", f"{m} best"]
        failures = any(row["failure"] for row in self.rows)
        if failures:
            head.append("failure")
        body = []
        for row in self.rows:
            steps = f"{step_of(row)}/{row['total']}" if row["total"] else str(step_of(row))
            state = row["state"] + (f" at {row['pruned_at']}" if row.get("pruned_at") is not None else "")
            state += " (earlier)" if row["reused"] else ""
            cells = [str(row["index"]), *(_fmt(row["config"].get(k, "")) for k in keys), state, steps]
            cells.append(wall_time_text(row["duration"], row.get("pool_start", 0.0)))
            for m in metrics:
                final = last_text(row, m)
                bad = row.get("nonfinite", {}).get(m)
                if bad is not None:
                    final = nonfinite_text(bad, final)
                cells += [final, _fmt(row["best"].get(m, ""))]
            if failures:
                text = " ".join(row["failure"].split())
                cells.append(text if len(text) <= 160 else text[:157] + "...")
            body.append(cells)
        return head, body

    def _repr_html_(self) -> str:
        head, body = self.table()
        th = "".join(f"<th>{escape_html(h)}</th>" for h in head)
        trs = "".join(
            f'<tr class="orch-trial" data-state="{escape_html(row["state"])}"'
            + "".join(
                f' data-nonfinite-{escape_html(m)}="{bad["step"]}"'
                for m, bad in row.get("nonfinite", {}).items()
                if m.replace("_", "").isalnum()
            )
            + ">"
            + "".join(f"<td>{escape_html(c)}</td>" for c in cells)
            + "</tr>"
            for row, cells in zip(self.rows, body, strict=True)
        )
        return (
            f'<table class="orch-sweep-results"><caption>sweep {escape_html(self.name)}</caption>'
            f"<thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"
        )

    def __repr__(self) -> str:
        head, body = self.table()
        widths = [max(len(c) for c in col) for col in zip(head, *body, strict=True)]
        lines = ["  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) for cells in [head, *body]]
        return "\n".join([f"sweep {self.name}", *lines])


def _fmt(value: Any) -> str:
    return value_text(value)  # lr=0.4457 here as in the sweep's panel


def step_of(row: dict[str, Any]) -> int:
    """The step a config's row shows: a pruned config's is its rung, where it was judged and
    stopped (its ranks may have counted a step past it); any other's, its slowest rank's."""
    pruned_at = row.get("pruned_at")
    return int(pruned_at) if pruned_at is not None else int(row["steps"])


def last_text(row: dict[str, Any], metric: str) -> str:
    """A metric's last value in a row; logged before the run's last step, with its step:
    ``0.1056 (step 0)`` for the accuracy of a config pruned at step 10 that evaluates every 50."""
    value = row["final"].get(metric)
    if value is None:
        return ""
    steps = {m: s for m, s in row.get("last_step", {}).items() if not m.startswith(OWN_METRICS)}
    at = steps.get(metric)
    behind = at is not None and at < max(steps.values(), default=at)
    return _fmt(value) + (f" (step {at})" if behind else "")


def nonfinite_text(bad: dict[str, Any], final: str = "") -> str:
    """A metric that went NaN or inf, as its cell, in the words the live panel uses:
    ``inf from step 45 (last finite 6.433e+35 at step 44)``, or, for one that came back, its
    final value and ``(inf at step 45)``."""
    words = nonfinite_words(
        bad["value"], bad["step"], bad["last_finite"], bad.get("last_finite_step", -1), bool(bad["stays"])
    )
    return f"{final} ({words})" if not bad["stays"] else words


def wall_time_text(duration: float, pool_start: float = 0.0) -> str:
    """A run's wall time, the workers' pool's cold start apart: ``2.1s (+14.8s pool start)``."""
    if pool_start >= 0.05:
        return f"{max(0.0, duration - pool_start):.1f}s (+{pool_start:.1f}s pool start)"
    return f"{duration:.1f}s"


_FAILED = (RunState.FAILED.value, CANCELLED)


def _order(row: dict[str, Any], metric: str, sign: float) -> tuple[int, float]:
    """Where a row sorts: the finite values first (best first), then the rows whose value is
    NaN or inf or missing, then the failed and cancelled ones (their finite values first)."""
    value = row["final"].get(metric)
    finite = value is not None and math.isfinite(value)
    if row["state"] in _FAILED:
        return (2 if finite else 3, sign * value if finite else 0.0)
    return (0 if finite else 1, sign * value if finite else 0.0)


def stays_nonfinite(row: dict[str, Any], metric: str) -> bool:
    """The row's ``metric`` went NaN or inf and its final value is not finite."""
    bad = row.get("nonfinite", {}).get(metric)
    return bad is not None and bool(bad["stays"])


def best_trial(
    trials: Sequence[Trial],
    name: str,
    metric: str = "loss",
    mode: Literal["min", "max"] | None = None,
    scope: Literal["last", "all"] = "last",
) -> Trial:
    """:meth:`Sweep.best` of the trials of sweep ``name``: the succeeded one whose ``metric``
    (mean over ranks) is best by its last value or its best value over the run (``scope``)."""
    mode = mode or default_mode(metric)
    if mode not in ("min", "max") or scope not in ("last", "all"):
        raise ConfigError(
            f"best(): mode must be 'min' or 'max' and scope 'last' or 'all', got {mode!r}, {scope!r}"
        )
    candidates = []
    for trial in trials:
        if trial.state != RunState.SUCCEEDED.value:
            continue
        row = trial.summary({metric: mode})
        if stays_nonfinite(row, metric):
            continue  # it ended NaN or inf: whatever it reached before, it is no result
        value = row["final" if scope == "last" else "best"].get(metric)
        if value is not None and math.isfinite(value):
            candidates.append((value if mode == "min" else -value, trial.index, trial))
    if not candidates:
        logged = sorted({m for t in trials for m in t.history() if not m.startswith(OWN_METRICS)})
        diverged = [
            str(t.index)
            for t in trials
            if t.state == RunState.SUCCEEDED.value and stays_nonfinite(t.summary({metric: mode}), metric)
        ]
        why = f": configs {', '.join(diverged)} ended with it NaN or inf" if diverged else ""
        raise OrchError(
            f"no succeeded run of sweep {name} logged {metric!r}"
            + (" as a finite number" + why if diverged else "")
            + (f" (metrics logged: {', '.join(logged)})" if logged and not diverged else "")
        )
    return min(candidates, key=lambda c: (c[0], c[1]))[2]


def dashboard_rows(results: SweepResults, metric: str = "loss") -> list[dict[str, Any]]:
    """:meth:`Sweep.rows`: each config's state, step, last and best values, the best run marked."""
    out = []
    for row in results:
        out.append(
            {
                "index": row["index"],
                "run_id": row["run_id"],
                "config": row["config"],
                "state": row["state"],
                "step": step_of(row),  # a pruned config's rung
                "total": row["total"],
                "last": row["final"],
                "best": row["best"],
                "nonfinite": row.get("nonfinite", {}),
                "failure": row["failure"],
                "best_run": False,
            }
        )
    finals = [
        (r["last"][metric] if default_mode(metric) == "min" else -r["last"][metric], r["index"])
        for r in out
        if r["state"] == RunState.SUCCEEDED.value and math.isfinite(r["last"].get(metric, math.nan))
    ]
    if finals:
        out[min(finals)[1]]["best_run"] = True
    return out
