"""Runs are named by where their function came from: the notebook and cell, or the script.

A function defined in a notebook or a script lives in ``__main__``, which names nothing; the
launch records where it was defined (``run.json``'s ``origin``), and ``orch.runs()`` and
``orch runs`` show it. The notebook is the one Jupyter tells the kernel (``JPY_SESSION_NAME``,
which jupyter_server sets for every kernel it starts for a notebook).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TESTS, notebook_kernel, orch_cli

pytestmark = pytest.mark.timeout(300)

TRAIN_CELL = """\
import orch

def train(ctx):
    for step in ctx.steps(3):
        ctx.log(step, loss=1.0 / (step + 1))
"""

RUN_CELL = """\
with orch.launch(train, world_size=1, run_root={run_root!r}) as run:
    run.wait(timeout=120)
row = orch.runs({run_root!r})[run.run_id]
print(json.dumps({{"run_id": run.run_id, "origin": row.origin, "cell": row.cells()[2]}}))
"""


def test_a_notebook_run_is_named_by_its_notebook_and_cell(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    run_root = tmp_path / "runs"
    env = {**os.environ, "JPY_SESSION_NAME": str(tmp_path / "analysis.ipynb")}
    out: list[str] = []
    with notebook_kernel(tmp_path, env=env) as (_, kc):
        for code in ("import json", TRAIN_CELL, RUN_CELL.format(run_root=str(run_root))):
            reply = kc.execute_interactive(
                code, timeout=180, output_hook=lambda m: out.append(m["content"].get("text", ""))
            )
            assert reply["content"]["status"] == "ok", reply["content"]
    seen = json.loads("".join(out).strip().splitlines()[-1])
    expected = "analysis.ipynb:train (Cell In[2])"  # the kernel's folder: the notebook's, relative
    assert seen["origin"] == seen["cell"] == expected, seen
    meta = json.loads((run_root / seen["run_id"] / "run.json").read_text())
    assert meta["origin"] == expected and meta["fn"] == "__main__:train"
    listed = orch_cli("runs", "--json", "--run-root", str(run_root), env=subprocess_env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [r["origin"] for r in json.loads(listed.stdout)] == [expected]
    text = orch_cli("runs", "--run-root", str(run_root), env=subprocess_env, cwd=tmp_path)
    assert expected in text.stdout, text.stdout
    shown = orch_cli("show", seen["run_id"], "--run-root", str(run_root), env=subprocess_env, cwd=tmp_path)
    assert expected in shown.stdout, shown.stdout


SCRIPT = """\
import sys
import orch

def main(ctx):
    for step in ctx.steps(2):
        ctx.log(step, loss=1.0)

if __name__ == "__main__":
    with orch.launch(main, world_size=1, run_root=sys.argv[1]) as run:
        run.wait(timeout=120)
    print(orch.runs(sys.argv[1])[run.run_id].origin)
"""


def test_a_script_run_is_named_by_its_script(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    (tmp_path / "train_here.py").write_text(SCRIPT)
    env = {**subprocess_env, "PYTHONPATH": str(TESTS)}
    env.pop("JPY_SESSION_NAME", None)
    proc = subprocess.run(
        [sys.executable, "train_here.py", str(tmp_path / "runs")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "train_here.py:main"
