"""Runs on a real Slurm cluster (tests/slurmcluster.py: slurmctld and two slurmd nodes, each in
its own network and hostname namespace), launched with ``orch.launch(..., cluster=orch.Slurm(...))``.

The master runs in the launching process (a notebook kernel, or this test's process), bound to
the bridge address the nodes reach; one batch job runs a host agent per node. What is checked
is what a user sees and what is left behind: the ranks on both nodes with identical
parameters, the job id and nodes in the panel, a stop that ends the job, a rank killed on node
2 restarting the group on both nodes from the checkpoint, and a kernel killed alone leaving no
job and no process. The cluster's jobs inherit this test's environment, so the autouse check
of tests/conftest.py also finds any of their processes left on the nodes.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

import jobs
import orch
from conftest import TESTS, notebook_kernel, orch_cli
from conftest import until_value as until
from orch.wire.states import RunState
from slurmcluster import SlurmCluster
from slurmcluster import slurm_cluster as slurm_cluster

pytestmark = pytest.mark.timeout(300)

LIVE = "PENDING,RUNNING,COMPLETING,CONFIGURING,SUSPENDED"


@pytest.fixture
def on_cluster(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> SlurmCluster:
    """This process talks to the cluster (sbatch finds it through SLURM_CONF), and its jobs
    import the test jobs (tests/ on their PYTHONPATH: sbatch exports this environment)."""
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    monkeypatch.chdir(tmp_path)  # the launches' folder (their jobs' too): nothing lands in the repo
    return slurm_cluster


def live_jobs(c: SlurmCluster, name: str = "") -> list[dict[str, str]]:
    return [j for j in c.squeue(states=LIVE) if name in j["name"]]


def nothing_left(c: SlurmCluster) -> bool:
    return not live_jobs(c) and not any(c.node_pids(n) for n in c.node_names)


NOTEBOOK_CELL = """
import json, time
import torch
import orch

def fit(ctx):
    # Defined in this cell: it reaches the nodes through the run dir, signed with the run's token.
    model = ctx.ddp(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(ctx.rank)
    x = torch.randn(32, 4)
    y = x.sum(1, keepdim=True)
    for step in ctx.steps(40):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(step, loss=loss.item())
        time.sleep(0.02)

run = orch.launch(fit, world_size=4, cluster=orch.Slurm(nodes=2, tasks_per_node=2), run_root={root!r})
panel = run.panel()
headers = []
while not run.done:
    if panel.header.value not in headers:
        headers.append(panel.header.value)
    time.sleep(0.05)
result = run.wait()
panel.refresh()
headers.append(panel.header.value)
m = run.state()
ranks = [{{"rank": r.rank, "host": r.host, "checksum": r.param_checksum, "step": r.step}} for r in m.ranks]
print(json.dumps({{"state": result.state.value, "job": m.job.as_dict(), "headers": headers, "ranks": ranks}}))
"""


def test_a_notebook_kernel_runs_the_ranks_on_both_nodes(on_cluster: SlurmCluster, tmp_path: Path) -> None:
    c = on_cluster
    with notebook_kernel(tmp_path, env=dict(os.environ)) as (_, kc):
        out: list[str] = []
        reply = kc.execute_interactive(
            NOTEBOOK_CELL.format(root=str(tmp_path)),
            timeout=240,
            output_hook=lambda msg: out.append(msg["content"].get("text", "")),
        )
        assert reply["content"]["status"] == "ok", (reply["content"], "".join(out))
        said = json.loads("".join(out).strip().splitlines()[-1])
    assert said["state"] == "SUCCEEDED", said
    job = said["job"]
    ranks = said["ranks"]
    # Two ranks on each node, every one at the last step, the parameters identical everywhere.
    assert Counter(r["host"] for r in ranks) == Counter({n: 2 for n in c.node_names}), ranks
    assert all(r["step"] == 40 for r in ranks), ranks
    checksums = {r["checksum"] for r in ranks}
    assert len(checksums) == 1 and "" not in checksums, ranks
    # The panel showed the job id, and the nodes once the job ran.
    headers = "\n".join(said["headers"])
    assert f"slurm job {job['job_id']}: RUNNING on {job['nodes']}" in headers, headers
    assert set(job["nodes"].split(",")) == set(c.node_names), job
    # The job ended with the run (it is over in squeue), and nothing of it runs on the nodes.
    record = c.wait_job(int(job["job_id"]), 30)
    assert record["state"] in ("COMPLETED", "GONE"), record
    until(lambda: nothing_left(c), 20)


def test_stop_ends_the_run_stopped_and_the_job_with_it(on_cluster: SlurmCluster, tmp_path: Path) -> None:
    c = on_cluster
    run = orch.launch(
        "jobs:long_barriers",
        world_size=4,
        cluster=orch.Slurm(nodes=2, tasks_per_node=2),
        run_root=str(tmp_path),
    )
    try:
        until(
            lambda: run.state().state is RunState.RUNNING and min(r.step for r in run.state().ranks) > 3, 120
        )
        job_id = run.job.job_id if run.job else ""
        assert [j["job_id"] for j in live_jobs(c)] == [job_id]
        # The token travels in the environment only: not in the job script, nor in the
        # watcher's command line or environment.
        assert run.token not in (run.run_dir / "job.sh").read_text()
        (watcher,) = [p for p in psutil.process_iter() if "--cancel-when-orphaned" in " ".join(_argv(p))
                      and f"orch-{run.run_id}" in _argv(p)]  # fmt: skip
        assert run.token not in " ".join(watcher.cmdline())
        assert run.token not in "".join(watcher.environ().values())
        run.stop()
        result = run.wait(timeout=60)
        assert result.state is RunState.STOPPED
        # The stop was graceful: every rank stopped at the same step, then the job went.
        assert len(set(result.steps)) == 1, result.steps
        until(lambda: not live_jobs(c), 20)
        assert c.wait_job(int(job_id), 5)["state"] in ("COMPLETED", "CANCELLED", "GONE")
    finally:
        run.close()
    until(lambda: nothing_left(c), 20)


def _watcher_of(run: orch.Run) -> psutil.Process:
    (watcher,) = [p for p in psutil.process_iter() if "--cancel-when-orphaned" in " ".join(_argv(p))
                  and f"orch-{run.run_id}" in _argv(p)]  # fmt: skip
    return watcher


def test_close_cancels_a_running_job_itself(on_cluster: SlurmCluster, tmp_path: Path) -> None:
    """close() scancels the job while this process lives: the job ends CANCELLED (not
    COMPLETED by its host agents once the master is gone), and the orphan watcher, which would
    cancel it only once this process died, is released."""
    c = on_cluster
    run = orch.launch(
        "jobs:long_barriers",
        world_size=2,
        cluster=orch.Slurm(nodes=2, tasks_per_node=1),
        run_root=str(tmp_path),
    )
    try:
        until(
            lambda: run.state().state is RunState.RUNNING and min(r.step for r in run.state().ranks) > 1, 90
        )
        assert run.job is not None and run.job.job_id
        job_id, watcher = int(run.job.job_id), _watcher_of(run)
    finally:
        run.close()
    assert c.wait_job(job_id, 15)["state"] in ("CANCELLED", "GONE")
    watcher.wait(10)  # released by the cancel, not waiting for this process to die
    assert run.state().job is not None and run.state().job.state == "CANCELLED", run.state().job
    until(lambda: nothing_left(c), 20)


def test_close_cancels_a_job_still_waiting_in_the_queue(on_cluster: SlurmCluster, tmp_path: Path) -> None:
    """A job PENDING behind another: close() takes it out of the queue at once; nothing else
    would while this process lives (no host agent of it runs to notice the master is gone)."""
    c = on_cluster
    blocker = c.sbatch("-N2", "--exclusive", "--job-name=blocker", "-o", "/dev/null", "--wrap", "sleep 120")
    try:
        until(lambda: any(j["state"] == "RUNNING" for j in live_jobs(c, "blocker")), 30)
        run = orch.launch(
            "jobs:allreduce_steps",
            world_size=2,
            cluster=orch.Slurm(nodes=2, tasks_per_node=1),
            run_root=str(tmp_path),
        )
        try:
            until(lambda: run.state().job is not None and run.state().job.state == "PENDING", 30)
            assert run.job is not None and run.job.job_id
            job_id, watcher = int(run.job.job_id), _watcher_of(run)
        finally:
            run.close()
        assert c.wait_job(job_id, 10)["state"] in ("CANCELLED", "GONE")
        assert not [j for j in c.squeue(states=LIVE) if j["job_id"] == str(job_id)]
        watcher.wait(10)
        # The record says how the job ended: cancelled by close(), not left waiting.
        assert run.state().job is not None and run.state().job.state == "CANCELLED", run.state().job
    finally:
        c.run("scancel", str(blocker), check=False)
    until(lambda: nothing_left(c), 20)


def test_a_rank_killed_on_node2_restarts_the_group_on_both_nodes(
    on_cluster: SlurmCluster, tmp_path: Path
) -> None:
    c = on_cluster
    node2 = c.node_names[1]
    run = orch.launch(
        "jobs:checkpointed",
        world_size=4,
        cluster=orch.Slurm(nodes=2, tasks_per_node=2),
        max_restarts=1,
        run_root=str(tmp_path),
        config={"steps": 60, "sleep": 0.05, "die_on_attempts": []},
    )
    try:

        def past_checkpoint() -> Any:
            m = run.state()
            ok = m.state is RunState.RUNNING and len(m.ranks) == 4 and all(r.step > 14 for r in m.ranks)
            return m if ok else None

        m = until(past_checkpoint, 150)
        victim = next(r for r in m.ranks if r.host == node2)
        assert victim.pid in c.node_pids(node2)  # the rank's process runs on node 2
        first_pids = {r.pid for r in m.ranks}
        os.kill(victim.pid, signal.SIGKILL)
        result = run.wait(timeout=200)
        assert result.state is RunState.SUCCEEDED and result.steps == [60] * 4
        final = run.state()
        assert final.attempt == 2
        assert Counter(r.host for r in final.ranks) == Counter({n: 2 for n in c.node_names})
        assert not first_pids & {r.pid for r in final.ranks}  # new processes, on both nodes
        assert len({r.param_checksum for r in final.ranks}) == 1
        said = [e[3] for e in final.events if e[1] in ("attempt_failed", "root_cause")]
        assert any(f"rank {victim.rank} (" in s and "SIGKILL" in s for s in said), said
        # One job: the restart happened inside its allocation, without a second wait in the queue.
        assert [j["name"] for j in c.squeue()].count(f"orch-{run.run_id}") == 1
        # Each rank's log, written on its node into the shared run dir, is the panel's log tail.
        logs = run.log_files()
        assert all("process group up" in logs[r.worker_id].read_text() for r in final.ranks), logs
        history = run.history()
        for rank in range(4):
            assert history["loss"][rank]["step"] == list(range(60)), rank
            attempts = history["attempt"][rank]["value"]
            resumed = attempts.index(2.0)
            assert resumed >= 10 and resumed % 10 == 0, attempts  # from a checkpoint, not from step 0
    finally:
        run.close()
    until(lambda: nothing_left(c), 20)


KERNEL_CELL = """
import orch
from orch.views.waiting import wait_for
run = orch.launch('jobs:long_barriers', world_size=4, cluster=orch.Slurm(nodes=2, tasks_per_node=2),
                  run_root={root!r}, heartbeat_timeout={timeout})
assert wait_for(lambda: run.state().state.value == 'RUNNING', 120)
print(run.job.job_id)
"""


def test_a_kernel_killed_alone_leaves_no_job_and_no_process(on_cluster: SlurmCluster, tmp_path: Path) -> None:
    c = on_cluster
    timeout = 10.0
    with notebook_kernel(tmp_path, env=dict(os.environ)) as (km, kc):
        out: list[str] = []
        reply = kc.execute_interactive(
            KERNEL_CELL.format(root=str(tmp_path), timeout=timeout),
            timeout=180,
            output_hook=lambda msg: out.append(msg["content"].get("text", "")),
        )
        assert reply["content"]["status"] == "ok", (reply["content"], "".join(out))
        job_id = "".join(out).split()[-1]
        assert [j["job_id"] for j in live_jobs(c)] == [job_id]
        pid = km.provisioner.pid  # type: ignore[union-attr]
        t0 = time.monotonic()
        psutil.Process(pid).kill()  # the kernel alone, as the OOM killer would
        until(lambda: not live_jobs(c), timeout)
        # Cancelled by the watcher the kernel left (not ended by the master's timeout).
        assert c.wait_job(int(job_id), 5)["state"] == "CANCELLED"
        until(lambda: not any(c.node_pids(n) for n in c.node_names), timeout + 5)
        gone = time.monotonic() - t0
    print(f"\nkernel killed alone: job {job_id} and every process on both nodes gone {gone:.2f}s later")
    assert gone < timeout + 5


def test_a_job_waiting_in_the_queue_says_why(on_cluster: SlurmCluster, tmp_path: Path) -> None:
    """All CPUs taken by another job: the run is PENDING and says the queue's reason; it runs
    once the other job is gone."""
    c = on_cluster
    blocker = c.sbatch("-N2", "--exclusive", "--job-name=blocker", "-o", "/dev/null", "--wrap", "sleep 120")
    try:
        until(lambda: any(j["state"] == "RUNNING" for j in live_jobs(c, "blocker")), 30)
        run = orch.launch(
            "jobs:allreduce_steps",
            world_size=4,
            cluster=orch.Slurm(nodes=2, tasks_per_node=2),
            run_root=str(tmp_path),
            config={"steps": 20},
        )
        try:

            def waiting() -> Any:
                m = run.state()
                return m if m.job is not None and m.job.reason not in ("", "None") else None

            m = until(waiting, 30)
            assert m.state is RunState.PENDING
            assert m.job is not None and m.job.describe().startswith(
                f"slurm job {m.job.job_id}: PENDING in the queue: "
            )
            assert m.job.reason in ("Resources", "Priority"), m.job
            c.run("scancel", str(blocker))
            result = run.wait(timeout=120)
            assert result.state is RunState.SUCCEEDED
        finally:
            run.close()
    finally:
        c.run("scancel", str(blocker), check=False)
    until(lambda: nothing_left(c), 20)


def test_a_partition_slurm_does_not_have_fails_the_launch_saying_so(
    on_cluster: SlurmCluster, tmp_path: Path
) -> None:
    with pytest.raises(orch.SlurmError) as e:
        orch.launch(
            "jobs:allreduce_steps",
            world_size=2,
            cluster=orch.Slurm(nodes=1, tasks_per_node=2, partition="nosuch"),
            run_root=str(tmp_path),
        )
    assert "Slurm has no partition 'nosuch'" in str(e.value) and "sinfo -s" in str(e.value)
    (run_dir,) = tmp_path.iterdir()
    record = json.loads((run_dir / "result.json").read_text())
    assert record["state"] == "FAILED" and "no partition 'nosuch'" in record["failure"]
    assert not live_jobs(on_cluster)


def test_a_job_cancelled_behind_the_runs_back_fails_the_run_saying_so(
    on_cluster: SlurmCluster, tmp_path: Path
) -> None:
    c = on_cluster
    run = orch.launch(
        "jobs:long_barriers",
        world_size=2,
        cluster=orch.Slurm(nodes=2, tasks_per_node=1),
        run_root=str(tmp_path),
    )
    try:
        until(lambda: run.state().state is RunState.RUNNING, 120)
        assert run.job is not None
        c.run("scancel", run.job.job_id)  # an administrator, or the time limit
        with pytest.raises(orch.RunFailed) as e:
            run.wait(timeout=60)
        failure = str(e.value)
        print(f"\nthe job cancelled behind the run's back: {failure}")
        # Either the master saw the ranks go first, or the job's end: the job's state is named.
        assert f"Slurm job {run.job.job_id} ended CANCELLED" in failure or "signal SIGTERM" in failure, (
            failure
        )
        assert any(f"slurm job {run.job.job_id} CANCELLED" in ev[3] for ev in run.state().events)
    finally:
        run.close()
    until(lambda: nothing_left(c), 20)


def test_orch_run_slurm_shows_the_job_and_succeeds(
    on_cluster: SlurmCluster, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    env = on_cluster.environ(subprocess_env)
    proc = orch_cli(
        "run", "--slurm", "--nodes", "2", "--tasks-per-node", "2", "--fn", "jobs:allreduce_steps",
        "--steps", "40", "--config", '{"sleep": 0.05}', "--run-root", str(tmp_path), "--refresh", "0.2",
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    first = out.splitlines()[0]
    assert "Slurm job " in first and "(2 node(s) of 2 ranks)" in first, first
    job_id = first.split("Slurm job ")[1].split()[0]
    # The dashboard's lines (plain text to a pipe) showed the job running on both nodes.
    assert f"slurm job {job_id}: RUNNING on " in out, out[-3000:]
    assert "SUCCEEDED" in out
    assert not live_jobs(on_cluster)
    until(lambda: nothing_left(on_cluster), 20)


def test_orch_run_slurm_options_need_slurm(subprocess_env: dict[str, str]) -> None:
    proc = orch_cli("run", "--nodes", "2", env=subprocess_env)
    assert proc.returncode == 2 and "--nodes only apply to a run on a cluster: add --slurm" in proc.stderr, (
        proc.stderr
    )
    proc = orch_cli("run", "--tasks-per-node", "2", env=subprocess_env)
    assert (
        proc.returncode == 2 and "--tasks-per-node only apply to a Slurm run: add --slurm" in proc.stderr
    ), proc.stderr
    proc = orch_cli("run", "--slurm", "--nodes", "2", "--workers", "3", env=subprocess_env)
    assert proc.returncode == 2 and "--workers 3 but --nodes x --tasks-per-node is 2" in proc.stderr, (
        proc.stderr
    )


def _argv(process: psutil.Process) -> list[str]:
    """A process's command line; empty for one that ended or is a zombie meanwhile (the other
    tests running beside this one start and reap processes of their own)."""
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []


def test_a_torchrun_script_runs_on_both_nodes_as_torchrun_runs_it(
    on_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """``orch.launch("train.py", args=..., cluster=orch.Slurm(...))``: the script and its
    arguments reach the nodes in the signed function file; each node's rank gets torchrun's
    numbering across hosts and trains as under torchrun on one host."""
    import shutil

    from integrations.theirs import CODE, assert_same_training, clean_env, run_torchrun

    script = Path(shutil.copy(CODE / "ddp_script.py", tmp_path / "train.py"))
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir(), theirs.mkdir()
    run = orch.launch(
        "train.py", world_size=2, args=["--epochs", "2", "--out", str(ours)],
        cluster=orch.Slurm(nodes=2, tasks_per_node=1), run_root=str(tmp_path / "runs"),
    )  # fmt: skip
    try:
        result = run.wait(timeout=240)
        hosts = [r.host for r in run.state().ranks]
    finally:
        run.close()
    assert result.state is RunState.SUCCEEDED
    assert sorted(hosts) == sorted(on_cluster.node_names), hosts  # one rank on each node
    for rank in (0, 1):  # whichever node registered first holds rank 0
        env = (ours / f"env-rank{rank}.txt").read_text()
        assert f"RANK={rank} LOCAL_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 GROUP_RANK={rank}" in env, env
    steps = {r: s["step"] for r, s in run.history()["train/loss"].items()}
    assert steps == {0: list(range(16)), 1: list(range(16))}, steps
    run_torchrun([str(script), "--epochs", "2", "--out", str(theirs)], tmp_path, clean_env())
    assert_same_training(ours, theirs)
    until(lambda: nothing_left(on_cluster), 20)


def test_a_gang_keeps_its_job_across_calls_and_close_cancels_it(
    on_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """orch.gang(cluster=...): one job, its ranks on both nodes taking one call after another in
    the same processes and process group (the model built by the first call trained by the next
    ones), objects pulled back, a failed call that broke a collective mended in the same
    processes; close() ends the job and every process on the nodes."""
    c = on_cluster
    with orch.gang(
        world_size=2, cluster=orch.Slurm(nodes=2, tasks_per_node=1), run_root=str(tmp_path)
    ) as gang:
        (job,) = live_jobs(c, "orch-gang-")
        assert gang.run(jobs.gang_build).wait(timeout=120).state is RunState.SUCCEEDED
        where = gang.run(jobs.gang_where).wait(timeout=120).values
        assert [w["rank"] for w in where] == [0, 1]
        assert sorted(w["host"] for w in where) == sorted(c.node_names)  # one rank on each node
        losses = [gang.run(jobs.gang_train, 5).wait(timeout=120).final_loss[0] for _ in range(2)]
        assert losses[0] > losses[1]  # the second call goes on from where the first left off
        assert gang.run(jobs.gang_where).wait(timeout=120).values == where  # the same processes
        x1 = gang.pull("x", rank=1)
        torch.manual_seed(2)  # what rank 1 drew in the first call
        assert torch.equal(x1, torch.randn(16, 4))
        # a call whose rank 1 raises while rank 0 waits in the gradient all-reduce, across the
        # nodes: the job and its processes stay, the group is made again, training goes on
        with pytest.raises(orch.RunFailed, match="bad batch on rank 1"):
            gang.run(jobs.gang_train_rank1_fails).wait(timeout=120)
        assert gang.run(jobs.gang_where).wait(timeout=120).values == where and gang.remakes == 1
        assert gang.run(jobs.gang_train, 5).wait(timeout=120).final_loss[0] < losses[1]
        assert [j["job_id"] for j in live_jobs(c, "orch-gang-")] == [job["job_id"]]  # one allocation
        states = [call.state().state for call in gang.calls]
        assert len(states) == 9 and states.count(RunState.FAILED) == 1, states
    until(lambda: not live_jobs(c), 20)
    until(lambda: nothing_left(c), 20)


GANG_CELL = """
import orch, jobs
gang = orch.gang(world_size=2, cluster=orch.Slurm(nodes=2, tasks_per_node=1), run_root={root!r})
gang.run(jobs.gang_build).wait(timeout=120)
print(gang.job.job.job_id)
"""


def test_a_kernel_killed_alone_while_its_gang_is_idle_leaves_no_job_and_no_process(
    on_cluster: SlurmCluster, tmp_path: Path
) -> None:
    c = on_cluster
    with notebook_kernel(tmp_path, env=dict(os.environ)) as (km, kc):
        out: list[str] = []
        reply = kc.execute_interactive(
            GANG_CELL.format(root=str(tmp_path)),
            timeout=180,
            output_hook=lambda msg: out.append(msg["content"].get("text", "")),
        )
        assert reply["content"]["status"] == "ok", (reply["content"], "".join(out))
        job_id = "".join(out).split()[-1]
        assert [j["job_id"] for j in live_jobs(c)] == [job_id]
        assert all(c.node_pids(n) for n in c.node_names)  # a gang rank on each node, idle
        psutil.Process(km.provisioner.pid).kill()  # type: ignore[union-attr]  # the kernel alone
        until(lambda: not live_jobs(c), 15)
        until(lambda: not any(c.node_pids(n) for n in c.node_names), 15)
    # Cancelled by the watcher the kernel left, or done first: its ranks leave once the kernel's
    # connection closes.
    assert c.wait_job(int(job_id), 5)["state"] in ("CANCELLED", "COMPLETED")
