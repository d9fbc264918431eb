"""Every notebook in notebooks/ runs under nbmake in a real kernel; then we read what it shows."""

from __future__ import annotations

import base64
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
    assert {nb.stem for nb in NOTEBOOKS} >= {"quickstart", "fault_tolerance", "sweep", "existing_code"}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[nb.stem for nb in NOTEBOOKS])
def test_notebook_runs_clean(notebook: Path, tmp_path: Path) -> None:
    nb = execute(notebook, tmp_path)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.output_type != "error", f"{notebook.name}: {out.get('ename')}: {out.get('evalue')}"
            assert not (out.output_type == "stream" and out.name == "stderr" and "Traceback" in out.text)
    if notebook.stem == "quickstart":
        check_quickstart(nb)
        # two launches of 4 ranks, then the gang's three %%orch calls of 2
        states = [("SUCCEEDED", "", 4)] * 2 + [("SUCCEEDED", "", 2)] * 3
    elif notebook.stem == "fault_tolerance":
        check_fault_tolerance(nb)
        states = [("SUCCEEDED", "attempt 2/2", 4), ("FAILED", "ValueError: bad batch on rank 2", 4)]
    elif notebook.stem == "sweep":
        check_sweep(nb, tmp_path / notebook.name)
        return
    elif notebook.stem == "existing_code":
        check_existing_code(nb)
        records = panel_records(nb)
        assert [(r["state"], r["world_size"]) for r in records] == [("SUCCEEDED", 2)] * 2
        return
    else:
        return
    # What a reader without the kernel sees: each panel's output is its final record
    records = panel_records(nb)
    assert [(r["state"], r["world_size"]) for r in records] == [(s, n) for s, _, n in states]
    for record, (_state, detail, _n) in zip(records, states, strict=True):
        assert detail in record["text/html"], record["text/html"][-2000:]
    check_nbconvert(tmp_path / notebook.name, records)


def panel_records(nb: nbformat.NotebookNode) -> list[dict[str, Any]]:
    """The saved output of every cell that shows a panel: a PNG, an HTML table, no widget; for
    a call that logged nothing (a gang's setup cell), its words instead of the PNG and the table."""
    records = []
    for cell in nb.cells:
        # a cell that shows a panel: run.panel() last, or a %%orch cell (its call's panel)
        shows = re.search(r"\.panel\(\)\s*$", cell.source) or cell.source.startswith("%%orch")
        if cell.cell_type != "code" or not shows:
            continue
        shown = ("display_data", "execute_result")
        [out] = [
            o for o in cell.outputs if o.output_type in shown and "orch-record" in o.data.get("text/html", "")
        ]
        data = out.data
        page = data["text/html"]
        [state] = re.findall(r'class="orch-state" data-state="(\w+)"', page)
        rows = re.findall(r'<tr class="orch-rank" data-rank="(\d+)"', page)
        if 'class="orch-no-points"' in page:  # nothing logged: no empty plot, no table of dashes
            assert sorted(data) == ["text/html", "text/plain"] and "<img" not in page, sorted(data)
            # The ranks in a line when their table would hold nothing but states ("2 ranks, both
            # SUCCEEDED", or by state: "FAILED: rank 2; STOPPED: ranks 0, 1, 3"), else the table.
            for line in re.findall(r'class="orch-ranks-line"[^>]*>([^<]+)<', page):
                alike = re.fullmatch(r"(\d+) ranks, (?:both|all) \w+", line)
                listed = [int(r) for part in line.split(";") for r in re.findall(r"\d+", part.split(":")[-1])]
                rows = [str(r) for r in range(int(alike.group(1)) if alike else len(listed))]
                assert alike or sorted(listed) == list(range(len(listed))), line
            assert rows, page[-2000:]
            records.append({**data, "state": state, "world_size": len(rows)})
            continue
        assert sorted(data) == ["image/png", "text/html", "text/plain"], sorted(data)
        assert base64.b64decode(data["image/png"]).startswith(b"\x89PNG\r\n")
        assert f'<img src="data:image/png;base64,{data["image/png"]}"' in page
        assert rows == [str(r) for r in range(len(rows))] and 'class="orch-ranks"' in page
        assert data["text/plain"].startswith("run ") and state in data["text/plain"].splitlines()[0]
        if state == "FAILED":
            assert "Root cause:" in page and "root cause:" in data["text/plain"]
        records.append({**data, "state": state, "world_size": len(rows)})
    return records


def check_nbconvert(notebook: Path, records: list[dict[str, Any]]) -> None:
    """``jupyter nbconvert --to html`` shows each record: its picture and its table."""
    subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(notebook)],
        cwd=notebook.parent,
        check=True,
        capture_output=True,
        timeout=300,
    )
    page = notebook.with_suffix(".html").read_text()
    pictured = [r for r in records if "image/png" in r]
    for record in pictured:
        # nbconvert may rewrite the tag (the order of its attributes): look for the picture in one
        picture = re.escape(record["image/png"][:200])
        assert re.search(r'<img [^>]*src="data:image/png;base64,' + picture, page)
    assert page.count('class="orch-record"') == len(records)
    assert page.count('class="orch-ranks"') >= len(pictured)
    assert page.count('class="orch-no-points"') == len(records) - len(pictured)
    for state in {r["state"] for r in records}:
        assert page.count(f'data-state="{state}"') >= sum(r["state"] == state for r in records)


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
    # (two launches of 4 ranks, then the gang's three %%orch calls of 2)
    headers = [v for v in widget_values(nb) if isinstance(v, str) and "orch-state" in v]
    assert len(headers) == 5 and all('data-state="SUCCEEDED"' in h for h in headers)
    tables = [v for v in widget_values(nb) if isinstance(v, str) and 'class="orch-ranks"' in v]
    assert sorted(t.count('class="orch-rank"') for t in tables) == [2, 2, 4, 4], tables
    # the gang's setup cell builds a model and logs nothing: its ranks in a line, no table
    lines = [v for v in widget_values(nb) if isinstance(v, str) and "orch-ranks-line" in v]
    assert len(lines) == 1 and "2 ranks, both SUCCEEDED" in lines[0], lines
    # the gang: trained in one cell, pulled into the kernel, trained again from where it stood
    slope, intercept = map(float, re.findall(r"slope ([-\d.]+) intercept ([-\d.]+)", text)[0])
    assert abs(slope - 3.0) < 0.5 and abs(intercept + 1.0) < 0.5, text
    first, second = (float(v) for v in re.findall(r"^([\d.e-]+)$", text, re.M)[-2:])
    assert second < first, (first, second)
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
    # What the cell printed, whole (a failure shows all of it, with the logs around it).
    cell = next(c for c in nb.cells if "failing.wait()" in c.get("source", ""))
    shown = cell.get("outputs", [])
    outputs = "\n".join(f"[{o.get('name', o.output_type)}] {o.get('text', '')}" for o in shown)
    printed = "".join(o.text for o in shown if o.output_type == "stream" and o.name == "stdout")
    assert "root cause: rank 2 exit code 1\n" in printed, outputs[-6000:]
    assert "ValueError: bad batch on rank 2" in printed, outputs[-6000:]
    headers = [v for v in widget_values(nb) if isinstance(v, str) and "orch-state" in v]
    assert any("attempt 2/2" in h and 'data-state="SUCCEEDED"' in h for h in headers)
    assert any('data-state="FAILED"' in h for h in headers)
    failures = [v for v in widget_values(nb) if isinstance(v, str) and "orch-failure" in v]
    assert any("bad batch on rank 2" in f for f in failures)


def check_existing_code(nb: nbformat.NotebookNode) -> None:
    """Accelerate and Lightning code in an orch run: two processes as the libraries count them,
    each on its half of the data, every rank's curve in the history."""
    text = text_of(nb)
    assert text.splitlines().count("SUCCEEDED") == 2, text  # each result.state, printed
    # Accelerate: 2 processes, a DDP model, 16 of the 32 batches a pass on each (3 passes)
    for index in (0, 1):
        assert f"process {index} of 2, 48 steps, model DistributedDataParallel" in text, text
    assert "rank_loss steps per rank: {0: 48, 1: 48}" in text, text
    assert "loss (rank 0, from Accelerate's tracker): 48 points" in text, text
    # Lightning: global ranks 0 and 1, 4 epochs of 16 steps, the loss down on each rank
    assert "global rank 0 of 2" in text and "global rank 1 of 2" in text, text
    curves = re.findall(r"rank (\d): steps 0\.\.(\d+), train_loss ([\d.]+) -> ([\d.]+)", text)
    assert [(rank, last) for rank, last, _, _ in curves] == [("0", "63"), ("1", "63")], text
    for rank, _, first, last in curves:
        assert float(last) < 0.1 * float(first), f"Lightning rank {rank}: {first} -> {last}"


def check_sweep(nb: nbformat.NotebookNode, path: Path) -> None:
    """The sweep notebook: four learning rates, the results, the best, the sweep's and the
    comparison's records as a reader without the kernel sees them."""
    outputs = {
        cell.source.splitlines()[-1]: [
            o for o in cell.outputs if o.output_type in ("display_data", "execute_result")
        ]
        for cell in nb.cells
        if cell.cell_type == "code" and cell.outputs
    }
    [table] = outputs["results"]
    assert table.data["text/html"].count('<tr class="orch-trial" data-state="SUCCEEDED">') == 4
    text = text_of(nb)
    best = re.search(r"lowest final loss: \{'lr': ([\d.]+), 'steps': 150\} ([\d.]+) (\w+)", text)
    assert best, text
    assert float(best.group(2)) < 0.5, "the best learning rate did not learn"
    assert "highest final accuracy:" in text
    [sweep_out] = outputs["sweep.panel()"]
    [compare_out] = outputs['orch.compare([best.run_id, worst["run_id"]], metric="loss")']
    for out in (sweep_out, compare_out):
        assert sorted(out.data) == ["image/png", "text/html", "text/plain"], sorted(out.data)
        assert base64.b64decode(out.data["image/png"]).startswith(b"\x89PNG\r\n")
        assert f'<img src="data:image/png;base64,{out.data["image/png"]}"' in out.data["text/html"]
    page = sweep_out.data["text/html"]
    assert 'class="orch-sweep-state" data-state="done"' in page
    assert page.count('<tr class="orch-trial" data-state="SUCCEEDED">') == 4
    assert "best by final loss: #" in page and f"(run {best.group(3)})" in page
    legend = compare_out.data["text/html"]
    assert legend.count('class="orch-compared"') == 2 and f'data-run="{best.group(3)}"' in legend
    assert legend.count("SUCCEEDED") == 2
    # orch.runs(): the sweep's four runs, each SUCCEEDED, and the slowest one read back.
    [runs_table] = outputs['table.filter(sweep="digits-lr")']
    listed = runs_table.data["text/html"]
    assert 'class="orch-runs"' in listed and listed.count(">SUCCEEDED</span>") == 4
    assert all(f"digits-lr[{i}]" in listed for i in range(4)) and best.group(3) in listed
    assert "4 succeeded; slowest: {'lr'" in text
    [loaded] = outputs["slowest.load()"]
    assert 'data-state="SUCCEEDED"' in loaded.data["text/html"] and "image/png" in loaded.data
    # The search: six TPE trials, some pruned at a rung (before their last step), the study read back.
    [searched] = outputs["search.wait()"]
    rows = re.findall(r'<tr class="orch-trial" data-state="(\w+)">', searched.data["text/html"])
    assert len(rows) == 6 and "PRUNED" in rows and "SUCCEEDED" in rows, rows
    cut = re.findall(r"PRUNED at (\d+)</td><td>(\d+)/240<", searched.data["text/html"])
    assert cut and all(int(rung) in (10, 30, 90) for rung, _ in cut), searched.data["text/html"]
    assert any(int(steps) < 240 for _, steps in cut), cut  # stopped before their last step
    assert "6 trials; best: {'lr': " in text
    [search_panel] = outputs["search.panel()"]
    assert "pruned (orch.ASHA(" in search_panel.data["text/html"]
    subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(path)],
        cwd=path.parent,
        check=True,
        capture_output=True,
        timeout=300,
    )
    converted = path.with_suffix(".html").read_text()
    assert converted.count('class="orch-record"') == 4  # the two sweeps, the comparison, a run
    assert converted.count('class="orch-trial" data-state="SUCCEEDED"') >= 4
