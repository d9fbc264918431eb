"""Every notebook in notebooks/ runs under nbmake in a real kernel; then we read what it shows."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest

from conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
pytestmark = pytest.mark.timeout(900)


def execute(notebook: Path, workdir: Path) -> nbformat.NotebookNode:
    """Run ``notebook`` with nbmake in a copy under ``workdir``; return the executed copy."""
    copy = workdir / notebook.name
    shutil.copy(notebook, copy)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--nbmake",
            "--overwrite",
            "--nbmake-timeout=600",
            "-p",
            "no:cacheprovider",
            "-q",
            str(copy),
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return nbformat.read(copy, as_version=4)


def text_of(nb: nbformat.NotebookNode) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                parts.append(out.text)
            elif "data" in out and "text/plain" in out.data:
                parts.append(out.data["text/plain"])
    return "\n".join(parts)


def widget_values(nb: nbformat.NotebookNode) -> list[Any]:
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    return [m["state"].get("value") for m in state.get("state", {}).values()]


def test_the_notebooks_are_there() -> None:
    assert {nb.stem for nb in NOTEBOOKS} >= {"quickstart", "fault_tolerance"}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[nb.stem for nb in NOTEBOOKS])
def test_notebook_runs_clean(notebook: Path, tmp_path: Path) -> None:
    nb = execute(notebook, tmp_path)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.output_type != "error", f"{notebook.name}: {out.get('ename')}: {out.get('evalue')}"
            assert not (out.output_type == "stream" and out.name == "stderr" and "Traceback" in out.text)
    if notebook.stem == "quickstart":
        check_quickstart(nb)
    elif notebook.stem == "fault_tolerance":
        check_fault_tolerance(nb)


def check_quickstart(nb: nbformat.NotebookNode) -> None:
    text = text_of(nb)
    for job in ("digits", "line"):
        ranks = re.findall(rf"{job} rank (\d): (\d+) points, loss ([\d.]+) -> ([\d.]+)", text)
        assert sorted(int(r[0]) for r in ranks) == [0, 1, 2, 3], text
        for rank, points, first, last in ranks:
            assert int(points) >= 100, (job, rank)
            assert float(last) < 0.25 * float(first), f"{job} rank {rank}: loss {first} -> {last}"
    assert "identical parameters on every rank: True" in text
    # the panels' final state is saved in the notebook's widget state, as a reader sees it
    headers = [v for v in widget_values(nb) if isinstance(v, str) and "orch-state" in v]
    assert len(headers) == 2 and all('data-state="SUCCEEDED"' in h for h in headers)
    tables = [v for v in widget_values(nb) if isinstance(v, str) and "orch-ranks" in v]
    assert all(t.count('class="orch-rank"') == 4 for t in tables) and tables
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "the final curves were not drawn"


def check_fault_tolerance(nb: nbformat.NotebookNode) -> None:
    text = text_of(nb)
    assert "SUCCEEDED after 2 attempts" in text
    assert "rank_failed  rank  1: process exited with signal SIGKILL" in text
    ranks = re.findall(
        r"rank (\d): steps 0\.\.119, attempt 1 until step (\d+), loss ([\d.]+) -> ([\d.]+)", text
    )
    assert sorted(int(r[0]) for r in ranks) == [0, 1, 2, 3], text
    for rank, last_of_first, first, last in ranks:
        assert int(last_of_first) == 39, f"rank {rank} did not resume after the step-39 checkpoint"
        assert float(last) < 0.2 * float(first), f"rank {rank}: loss {first} -> {last}"
    printed = [line for line in text.splitlines() if not line.startswith(("VBox", "HBox"))]
    assert "root cause: rank 2 exit code 1" in printed, printed
    assert "ValueError: bad batch on rank 2" in printed, printed
    headers = [v for v in widget_values(nb) if isinstance(v, str) and "orch-state" in v]
    assert any("attempt 2/2" in h and 'data-state="SUCCEEDED"' in h for h in headers)
    assert any('data-state="FAILED"' in h for h in headers)
    failures = [v for v in widget_values(nb) if isinstance(v, str) and "orch-failure" in v]
    assert any("bad batch on rank 2" in f for f in failures)
