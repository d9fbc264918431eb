"""gRPC's own log lines never reach a notebook cell: in a real kernel, orch's master closes an
idle client connection while a cell waits (the "Got goaway ... connection idle" INFO line of
gRPC's C core, which a kernel shows in the cell as stderr)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from conftest import notebook_kernel

pytestmark = pytest.mark.timeout(180)

IDLE_CELL = """\
import time
from orch.master.coordinator import Coordinator
from orch.master.control.plan import RunPlan
from orch.master.server import MasterServer
from orch.wire.client import MasterClient

server = MasterServer(Coordinator(RunPlan(1)), port=0, idle_timeout=0.5).start()
client = MasterClient(f"127.0.0.1:{server.port}")
client.wait_ready(10)
time.sleep(2.5)  # the cell waits; the master closes the idle connection meanwhile
client.wait_ready(10)  # and the client connects again
client.close()
server.stop()
print("done")
"""

GRPC_LINE = re.compile(r"^[IWE]\d{4} .*\.cc:\d+\]", re.M)  # gRPC's C core: I1202 12:00:00.1 ... x.cc:1403]


def cell_output(tmp_path: Path, first: str) -> str:
    """Everything a kernel printed for ``first`` and then the idle cell, stdout and stderr."""
    # ipykernel forwards what C code writes to fd 2 into the cell, as in JupyterLab, only when
    # it is not under pytest (PYTEST_CURRENT_TEST).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRPC_", "PYTEST_"))}
    out: list[str] = []
    with notebook_kernel(tmp_path, env=env) as (_, kc):
        for code in (first, IDLE_CELL):
            reply = kc.execute_interactive(
                code, timeout=60, output_hook=lambda m: out.append(str(m["content"].get("text", "")))
            )
            assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(out)


def test_the_masters_idle_close_prints_nothing_in_the_cell(tmp_path: Path) -> None:
    shown = cell_output(tmp_path, "import orch")
    assert "done" in shown
    assert not GRPC_LINE.search(shown) and "goaway" not in shown.lower(), shown


def test_a_user_who_loaded_grpc_first_keeps_grpcs_own_lines(tmp_path: Path) -> None:
    """The same cell where gRPC was imported before orch: gRPC's level is the user's (it is read
    at its import), and the line the test above looks for is there, so that test can see it."""
    shown = cell_output(tmp_path, "import grpc\nimport orch")
    assert "done" in shown
    assert GRPC_LINE.search(shown) and "goaway" in shown.lower(), shown
