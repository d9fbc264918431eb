"""A path to torch's own rendezvous that orch could not stand in for (here: code that asks
``torch.distributed.rendezvous("env://")`` itself) is given the run's store: no rank serves
a TCP store on MASTER_PORT, the ranks still meet, and the run says so in the rank's row and
its events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import orch
from probes import ORCH, run, workspace

pytestmark = pytest.mark.timeout(240)

SCRIPT = """
import json, os, sys
import torch.distributed as dist
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe import listening

store, rank, world = next(dist.rendezvous("env://"))
store.set(f"hello-{rank}", str(rank))
peer = store.get(f"hello-{1 - rank}").decode()
with open(os.path.join(sys.argv[1], f"seen{rank}.json"), "w") as f:
    json.dump({"peer": peer, "world": world, "listening": listening(),
               "port": os.environ["MASTER_PORT"]}, f)
"""


def test_torchs_own_env_rendezvous_gets_the_runs_store(tmp_path: Path) -> None:
    work = workspace(tmp_path)
    (work / "meet.py").write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    run([ORCH, "run", "--workers", "2", "--run-root", str(tmp_path / "runs"), "meet.py", str(out)], cwd=work)
    for rank in (0, 1):
        seen = json.loads((out / f"seen{rank}.json").read_text())
        assert (seen["peer"], seen["world"]) == (str(1 - rank), 2)
        port = seen["port"]
        assert not [s for s in seen["listening"] if s.endswith(f":{port}") or s.startswith("00000000")]
    record = orch.load_run(next((tmp_path / "runs").iterdir()))
    said = [e["message"] for e in record.events if "rendezvous (env://)" in e["message"]]
    assert said, [e["message"] for e in record.events]
    assert "given the run's store" in said[0]
