"""``orch run --ray ADDRESS`` on a real Ray cluster of two nodes on this machine
(tests/raycluster.py): a torchrun script's 4 ranks as 2 nodes x 2, run from the terminal as a
user runs it, and nothing of the run left in the cluster afterwards."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ORCH
from raycluster import RayCluster, available, start_cluster

pytestmark = pytest.mark.timeout(300)  # one cluster, alone on the machine: tests/conftest.py marks it serial


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    missing = available()
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"a Ray cluster cannot be brought up here: {missing}")
        pytest.skip(missing)
    with start_cluster() as cluster:
        yield cluster


# A script written for torchrun: each rank joins the group from torchrun's environment, sums
# its rank with the others' and writes what it was told, in the folder its argument names.
SCRIPT = """
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
names = ("RANK", "GROUP_RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
said = {k: os.environ[k] for k in names}
said["sum"] = int(total.item())
with open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"] + ".json"), "w") as f:
    f.write(__import__("json").dumps(said))
dist.destroy_process_group()
"""


def test_orch_run_ray_runs_a_script_as_4_ranks_on_two_nodes(ray_cluster: RayCluster, tmp_path: Path) -> None:
    script, out, root = tmp_path / "train.py", tmp_path / "out", tmp_path / "runs"
    script.write_text(SCRIPT)
    out.mkdir()
    env = {**ray_cluster.env, "ORCH_TEST_TAG": os.environ.get("ORCH_TEST_TAG", ""), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [ORCH, "run", "--ray", ray_cluster.address, "--nodes", "2", "--ranks-per-node", "2",
         "--run-root", str(root), "--refresh", "0.2", str(script), str(out)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first = proc.stdout.splitlines()[0]
    assert re.search(r"Ray job [0-9a-f]+ \(2 Ray node\(s\) of 2 ranks \(2 CPU each\)\), logs in ", first), (
        first
    )

    run_id = re.search(r"run ([0-9a-f]{12})", first)
    assert run_id, first
    result = json.loads((root / run_id.group(1) / "result.json").read_text())
    assert result["state"] == "SUCCEEDED" and len(result["ranks"]) == 4, result
    job = result["job"]
    assert job["scheduler"] == "ray" and job["state"] == "COMPLETED", job
    assert len({node.split("/")[1] for node in job["nodes"].split(",")}) == 2, job  # two Ray nodes

    said = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda s: int(s["RANK"]))
    assert [s["RANK"] for s in said] == ["0", "1", "2", "3"], said
    assert [s["GROUP_RANK"] for s in said] == ["0", "0", "1", "1"], said
    assert [s["LOCAL_RANK"] for s in said] == ["0", "1", "0", "1"], said
    assert {s["WORLD_SIZE"] for s in said} == {"4"} and {s["LOCAL_WORLD_SIZE"] for s in said} == {"2"}
    assert {s["sum"] for s in said} == {0 + 1 + 2 + 3}  # one process group across both nodes

    # Nothing of the run is left in the cluster: its group removed, its actors gone.
    assert set(ray_cluster.placement_groups()) == {"REMOVED"}
    assert ray_cluster.actors_alive() == 0
