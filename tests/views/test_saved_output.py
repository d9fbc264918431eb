"""An executed notebook keeps what a script printed: the panel's record holds rank 0's last lines.

``!torchrun train.py`` leaves the script's output in the cell; ``orch.launch("train.py")`` sends
each rank's to its log. The notebook is run by nbclient, as ``jupyter execute`` and nbmake run
it, in a real kernel with two real ranks; the saved panel cell's output (the static record
that replaced the live widget) holds the last lines rank 0 printed, as the live log tail shows them.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.timeout(300)

SCRIPT = """import os
import sys

rank = int(os.environ["RANK"])
for epoch in range(30):
    print(f"epoch {epoch}: loss {1.0 / (epoch + 1):.4f} on rank {rank}", flush=True)
print(f"done <rank {rank}>", file=sys.stderr, flush=True)
"""


def test_an_executed_notebook_keeps_rank_0_s_last_lines_in_the_panel_s_record(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                'import orch\n\nrun = orch.launch("train.py", world_size=2, run_root="runs")\n'
                "run.panel(interval=0.2)"
            ),
            nbformat.v4.new_code_cell('print("WAITED", run.wait().state.value)'),
            nbformat.v4.new_code_cell("run.close()"),
        ]
    )
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    nbformat.write(nb, tmp_path / "executed.ipynb")  # as saved
    saved = nbformat.read(tmp_path / "executed.ipynb", as_version=4)

    assert any("WAITED SUCCEEDED" in out.get("text", "") for out in saved.cells[1].outputs)
    (panel,) = saved.cells[0].outputs
    data = panel["data"]
    assert "application/vnd.jupyter.widget-view+json" not in data  # the record, not the widget
    page, text = data["text/html"], data["text/plain"]
    assert 'data-state="SUCCEEDED"' in page
    # rank 0's last lines, as the log tail shows them (its stderr too); not rank 1's
    assert 'class="orch-output" data-rank="0"' in page and "the last 20 lines of its output" in page
    assert "epoch 29: loss 0.0333 on rank 0" in page and "done &lt;rank 0&gt;" in page
    assert "epoch 28: loss 0.0345 on rank 0\nepoch 29: loss 0.0333 on rank 0\ndone <rank 0>" in text
    assert text.index("SUCCEEDED") < text.index("rank 0: the last 20 lines of its output")
    assert "epoch 5:" not in page and "on rank 1" not in page
