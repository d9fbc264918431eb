"""In a real notebook kernel: a cell-defined function that fails on one rank shows its own source."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

from conftest import TESTS, notebook_kernel

pytestmark = pytest.mark.timeout(240)

HELPER_CELL = """\
import orch

def scale(x):
    return x * 2  # a helper from another cell


def bad_day(ctx):
    for step in ctx.steps(50):
        ctx.log(step, loss=scale(1.0) / (step + 1))
        if ctx.rank == 1 and step == 3:
            raise ValueError("the data on rank 1 went bad")  # the raising line
"""

RUN_CELL = """\
run = orch.launch(bad_day, world_size=2, run_root={run_root!r})
panel = run.panel()
try:
    run.wait(timeout=120)
except orch.RunFailed as e:
    failed = e
panel.wait_done(30)
print(json.dumps({{"message": str(failed), "traceback": failed.traceback, "panel": panel.failure.value,
                  "rank": failed.rank}}))
run.close()
"""


def test_a_cell_function_failing_on_a_rank_shows_the_cell_and_its_line(tmp_path: Path) -> None:
    with notebook_kernel(tmp_path) as (_, kc):
        for code in ("import json", HELPER_CELL, RUN_CELL.format(run_root=str(tmp_path))):
            out: list[str] = []
            reply = kc.execute_interactive(
                code, timeout=180, output_hook=lambda m, out=out: out.append(m["content"].get("text", ""))
            )
            assert reply["content"]["status"] == "ok", reply["content"]
    seen = json.loads("".join(out).strip().splitlines()[-1])
    assert seen["rank"] == 1
    assert all(part in seen["message"] for part in ("rank 1 (host ", ", pid ")), seen["message"]
    for text in (seen["traceback"], html.unescape(seen["panel"])):
        # IPython's label for the cell (the second cell executed is In[2]), the line, its source.
        assert "Cell In[2], line 11, in bad_day" in text, text
        # It starts at the cell's function: orch's worker, which called it, is in the rank's log only.
        frames = text.split("Traceback (most recent call last):\n", 1)[1]
        assert frames.startswith("  Cell In[2], line 11"), text
        assert 'raise ValueError("the data on rank 1 went bad")  # the raising line' in text, text
        assert "<dynamic-code>" not in text
    assert "ValueError: the data on rank 1 went bad" in seen["traceback"]


def test_source_travels_with_a_function_pickled_by_value() -> None:
    import linecache
    import traceback

    import cloudpickle

    from orch.runtime.source import capture, install, label_cells

    cell = "/tmp/ipykernel_0/not-on-disk-42.py"
    source = "def helper(x):\n    return 1 / x  # divides\n\ndef train(ctx):\n    return helper(ctx)\n"
    linecache.cache[cell] = (len(source), None, source.splitlines(True), cell)
    namespace: dict[str, object] = {"__name__": "__main__"}
    exec(compile(source, cell, "exec"), namespace)
    sources = capture(namespace["train"])
    sources.labels[cell] = "Cell In[7]"
    del linecache.cache[cell]  # as in a worker: the source is not there
    train = cloudpickle.loads(cloudpickle.dumps(namespace["train"]))
    install(train, sources)
    try:
        train(0)
    except ZeroDivisionError:
        text = label_cells(traceback.format_exc(), sources)
    assert "Cell In[7], line 5, in train" in text and "return helper(ctx)" in text
    assert "Cell In[7], line 2, in helper" in text and "return 1 / x  # divides" in text


def test_interrupting_wait_returns_and_says_the_run_goes_on(tmp_path: Path) -> None:
    import os
    import signal
    import threading
    import time

    with notebook_kernel(tmp_path) as (km, kc):
        setup = (
            f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"
            "import orch\nfrom orch.views.waiting import wait_for\n"
            f"run = orch.launch('jobs:long_barriers', world_size=2, run_root={str(tmp_path)!r})\n"
            "assert wait_for(lambda: run.state().state.value == 'RUNNING', 90)\n"
        )
        assert kc.execute_interactive(setup, timeout=120)["content"]["status"] == "ok"
        # As "Interrupt Kernel" does it (jupyter_client's provisioner): SIGINT to the kernel's
        # whole process group, which holds the workers too.
        pgid = os.getpgid(km.provisioner.pid)  # type: ignore[union-attr]
        threading.Timer(2.0, os.killpg, (pgid, signal.SIGINT)).start()
        started = time.monotonic()
        reply = kc.execute_interactive("run.wait()", timeout=60)["content"]
        assert time.monotonic() - started < 30
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
        assert "still RUNNING" in reply["evalue"] and "run.stop()" in reply["evalue"]
        out: list[str] = []
        reply = kc.execute_interactive(
            "print(run.state().state.value); run.close(); print(run.state().state.value)",
            timeout=60,
            output_hook=lambda m: out.append(m["content"].get("text", "")),
        )["content"]
        assert reply["status"] == "ok" and "".join(out).split() == ["RUNNING", "FAILED"]


MISMATCH_CELL = """\
import torch
import torch.distributed as dist


def skips(ctx):
    model = ctx.ddp(torch.nn.Linear(4, 1))
    x = torch.randn(16, 4)
    for step in ctx.steps(50):
        model(x).pow(2).mean().backward()
        total = torch.ones(1)
        if not (ctx.rank == 1 and step == 3):
            dist.all_reduce(total)  # rank 1 skips this once
        ctx.log(step, loss=total.item())
"""


def test_a_collective_mismatch_in_a_cell_function_names_gloo_s_words_and_the_cell(tmp_path: Path) -> None:
    """gloo aborts rank 0 (no Python exception, only faulthandler's dump): the cell's line is
    still labelled as IPython labels it, with gloo's explanation beside it."""
    run_cell = RUN_CELL.replace("bad_day", "skips")
    with notebook_kernel(tmp_path) as (_, kc):
        for code in ("import json\nimport orch", MISMATCH_CELL, run_cell.format(run_root=str(tmp_path))):
            out: list[str] = []
            reply = kc.execute_interactive(
                code, timeout=180, output_hook=lambda m, out=out: out.append(m["content"].get("text", ""))
            )
            assert reply["content"]["status"] == "ok", reply["content"]
    seen = json.loads("".join(out).strip().splitlines()[-1])
    assert seen["rank"] == 0
    # The one line (RunFailed's message, the panel's first line): gloo's words and the cell's line.
    assert "gloo::EnforceNotMet in all_reduce (Cell In[2], line 12, in skips)" in seen["message"], seen
    assert "Is there a distributed collective mismatch in your code?" in seen["message"], seen
    for text in (seen["traceback"], html.unescape(seen["panel"])):
        assert "Cell In[2], line 12, in skips" in text, text
        assert "dist.all_reduce(total)  # rank 1 skips this once" in text, text
        assert "ipykernel" not in text and "Extension modules" not in text, text


ANSI = re.compile(r"\x1b\[[0-9;]*m")

TYPO_CELL = """\
def typo(ctx):
    for step in ctx.steps(20):
        ctx.log(step, loss=1.0)
        if step == 2:
            undefined_name + 1  # line 5
"""


def _error(kc: Any, code: str) -> dict[str, Any]:
    reply = kc.execute_interactive(code, timeout=180)["content"]
    assert reply["status"] == "error", reply
    return {**reply, "text": ANSI.sub("", "\n".join(reply["traceback"]))}


def test_orch_errors_lead_with_their_message_and_name_the_users_line(tmp_path: Path) -> None:
    """In a kernel, orch's own frames are left out of a ConfigError's and a RunFailed's
    traceback (the cell that called orch stays); %tb still prints them; and a RunFailed names
    the cell and line the rank raised at."""
    with notebook_kernel(tmp_path) as (_, kc):
        assert kc.execute_interactive("import orch", timeout=120)["content"]["status"] == "ok"
        bad = _error(kc, f"orch.launch(world_size=0, run_root={str(tmp_path)!r})")
        assert bad["ename"] == "ConfigError" and "world_size" in bad["evalue"]
        text = bad["text"]
        assert "Cell In[2], line 1" in text, text  # the user's own call
        # None of orch's frames: its files, and the __init__ a dataclass of orch made.
        assert "orch/" not in text and "launchers" not in text and "__create_fn__" not in text, text
        assert len(text.splitlines()) <= 12, text  # the message is near the top, not after 40 lines
        assert text.rstrip().endswith(bad["evalue"]), text
        full: list[str] = []
        kc.execute_interactive(
            "%tb", timeout=60, output_hook=lambda m: full.append(m["content"].get("text", "")) or
            full.extend(m["content"].get("traceback", []))
        )  # fmt: skip
        assert "orch/launchers/spec.py" in ANSI.sub("", "\n".join(full)), full  # all of it, on request

        assert kc.execute_interactive(TYPO_CELL, timeout=60)["content"]["status"] == "ok"
        launch = f"with orch.launch(typo, world_size=2, run_root={str(tmp_path)!r}) as run:\n"
        failed = _error(kc, launch + "    run.wait(timeout=120)")
        assert failed["ename"] == "RunFailed", failed["evalue"]
        assert "NameError: name 'undefined_name' is not defined" in failed["evalue"]
        assert "(at Cell In[4], line 5, in typo)" in failed["evalue"], failed["evalue"]
        assert "Cell In[5], line 2" in failed["text"] and "orch/" not in failed["text"], failed["text"]
