"""`orch worker` under a real Slurm: srun starts the ranks on two nodes, the master in the root.

The cluster (tests/slurmcluster.py) is a slurmctld and two slurmd nodes, each node in its own
network and hostname namespaces, wired to a bridge in the root namespace. First a batch job
that runs `hostname` on both nodes (the cluster works, and the nodes are two hosts), then the
job the project is for: `orch master` bound to the bridge's address, and a batch job whose
`srun -N 2 -n 4` starts one `orch worker` per rank, taking its rank from SLURM_PROCID. The
times are printed (``pytest -s``).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest

import orch
from conftest import ORCH, until
from slurmcluster import ENDED_STATES, SlurmCluster
from slurmcluster import slurm_cluster as slurm_cluster  # the fixture, for pytest to find here

pytestmark = pytest.mark.timeout(240)


def first_line(path: Path) -> str:
    """The first complete line of ``path`` ("" while there is none)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    head, newline, _ = text.partition("\n")
    return head if newline else ""


def test_a_job_runs_on_both_nodes_each_its_own_host(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    c = slurm_cluster
    node1, node2 = c.node_names
    out = tmp_path / "hostname-%j.out"
    start = time.monotonic()
    job = c.sbatch("-N", "2", "-o", str(out), "--wrap", "hostname; srun --label hostname | sort")
    path = Path(str(out).replace("%j", str(job)))
    until(lambda: first_line(path) != "", 30, 0.01)
    took = time.monotonic() - start
    first = first_line(path)
    print(f"\nsbatch to the job's first output line: {took:.2f}s")
    record = c.wait_job(job, 30)
    assert record["state"] in ("COMPLETED", "GONE"), (record, path.read_text())
    # The batch script ran on the first node; srun's two tasks, one on each, each saw its node's name.
    assert first == node1, path.read_text()
    assert path.read_text().splitlines()[1:] == [f"0: {node1}", f"1: {node2}"], path.read_text()
    # Measured ~0.9 s: slurmctld starts a job on its next 1-second tick. The bound is what a
    # loaded 2-core machine keeps; the default batch_sched_delay alone would add ~3 s.
    assert took < 60.0, f"sbatch took {took:.2f}s to the job's first line"
    # The daemons do not carry the test's tag (they outlive the test); the job's processes did.
    for name, daemon in c.daemons.items():
        assert "ORCH_TEST_TAG" not in psutil.Process(daemon.pid).environ(), name


def start_master(c: SlurmCluster, tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """`orch master --world-size 4` bound to the bridge's address; it and its address."""
    master = subprocess.Popen(
        [
            ORCH, "master", "--host", c.controller_ip, "--port", "0", "--world-size", "4",
            "--fn", "jobs:launcher_ranks", "--steps", "30", "--no-dashboard", "--linger", "0.5",
            "--seed", "5", "--run-root", str(tmp_path),
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert master.stdout is not None
    line = master.stdout.readline()
    m = re.search(r"serving on (\S+);", line)
    if m is None:
        master.kill()
        raise AssertionError(line + master.communicate()[0])
    assert m.group(1).startswith(f"{c.controller_ip}:"), line
    return master, m.group(1)


@pytest.mark.timeout(300)
def test_srun_starts_one_orch_worker_per_rank_on_both_nodes(
    slurm_cluster: SlurmCluster, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    c = slurm_cluster
    node1, node2 = c.nodes
    # The master binds a non-loopback address: it takes ORCH_TOKEN (subprocess_env's), which the
    # job gets from sbatch exporting this environment, as it gets PYTHONPATH (tests/: jobs.py).
    env = c.environ(subprocess_env)
    start = time.monotonic()
    master, address = start_master(c, tmp_path, env)
    job = 0
    try:
        worker = [ORCH, "worker", "--master", address, "--fn", "jobs:launcher_ranks", "--threads", "1"]
        srun = ["srun", "-N", "2", "-n", "4", "--ntasks-per-node", "2", *worker, "--run-root", str(tmp_path)]
        job = c.sbatch(
            "-N", "2", "-n", "4", "--ntasks-per-node", "2", "--chdir", str(tmp_path),
            "-o", str(tmp_path / "job-%j.out"), "--wrap", shlex.join(srun), env=env,
        )  # fmt: skip
        out, _ = master.communicate(timeout=240)
        record = c.wait_job(job, 60)  # the workers exit a little after the master
    finally:
        if master.poll() is None:
            master.kill()
            master.communicate()
        # Only when the test failed before the job ended: its workers would wait for the master.
        if job and any(j["state"] not in ENDED_STATES for j in c.squeue(job)):
            c.run("scancel", str(job), check=False)
    took = time.monotonic() - start
    job_out = (tmp_path / f"job-{job}.out").read_text(errors="replace")
    assert master.returncode == 0, out + job_out
    assert record["state"] in ("COMPLETED", "GONE"), (record, job_out)

    run_dir = next(tmp_path.glob("*/result.json")).parent
    result: dict[str, Any] = json.loads((run_dir / "result.json").read_text())
    assert result["state"] == "SUCCEEDED", result["failure"] + job_out
    ranks = result["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert all(r["state"] == "SUCCEEDED" and r["step"] == 30 for r in ranks), ranks
    # Each rank is srun's task of that SLURM_PROCID, and saw Slurm's local id and task count.
    history = orch.load_run(run_dir).history()
    for r in range(4):
        seen = {name: history[name][r]["value"][-1] for name in history if name != "loss"}
        assert seen["orch_rank"] == seen["env_rank"] == r, seen
        assert seen["orch_local_rank"] == seen["env_local_rank"] == r % 2, seen
        assert seen["env_world"] == 4, seen
        assert seen["initial_seed"] == 5 + r, seen  # orch master --seed 5 reached the rank
    # Two ranks on each node, as srun's block distribution places them: by the hostname each
    # reported (its UTS namespace) and the address it advertised (its network namespace).
    assert Counter(r["host"] for r in ranks) == {node1.name: 2, node2.name: 2}, ranks
    for r in ranks:
        node = node1 if r["rank"] < 2 else node2
        assert r["host"] == node.name and r["address"].partition(":")[0] == node.ip, r
    assert result["rendezvous"].rpartition(":")[0] == node1.ip, result["rendezvous"]
    # DDP kept the parameters identical on every rank.
    checksums = {r["param_checksum"] for r in ranks}
    assert len(checksums) == 1 and "" not in checksums, checksums

    # The job has left squeue's live states, and nothing of it runs on either node.
    assert all(j["state"] in ENDED_STATES for j in c.squeue(job)), c.squeue(job)
    assert c.squeue(job, states="pending,configuring,running,completing,suspended") == []
    until(lambda: not any(c.node_pids(n.name) for n in c.nodes), 30)
    print(
        f"\nsrun -n 4 orch worker on {node1.name} and {node2.name}: master start to job ended "
        f"{took:.1f}s; rendezvous {result['rendezvous']}"
    )
