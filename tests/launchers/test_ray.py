"""Runs on a real Ray cluster of two nodes on this machine (tests/raycluster.py): a placement
group of one bundle per node, an actor per node running orch's host agent, ranks with
torchrun's contract, Stop, the launcher's death, and a placement the cluster cannot give.
Each run's launcher is a process of its own (the Ray driver), as a notebook kernel is."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from conftest import TESTS
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


def _driver(cluster: RayCluster, code: str) -> subprocess.Popen[str]:
    env = {**cluster.env, "ORCH_TEST_TAG": os.environ.get("ORCH_TEST_TAG", "")}
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 240) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-4000:]
    # The driver's last JSON line (Ray may print its own lines after it as the driver exits).
    return json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("{")))


def _gone(pids: list[int], within: float) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [
            p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


RUN = """
import json, os, sys
sys.path.insert(0, {tests!r})
import torch
import orch

def train(ctx):
    torch.manual_seed(0)
    model = ctx.ddp(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(ctx.rank)
    x = torch.randn(32, 8, generator=g)
    for step in ctx.steps(10):
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        ctx.log(step, loss=loss.item())
    names = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
    params = [p.detach().sum().item() for p in model.parameters()]
    return {{"env": {{k: os.environ.get(k) for k in names}}, "params": params}}

run = orch.launch(train, world_size=4, run_root={root!r},
                  cluster=orch.Ray(address={address!r}, nodes=2, ranks_per_node=2))
result = run.wait(timeout=200)
job = run.state().job
run.close()
said = {{"state": result.state.value, "values": result.values, "job": [job.scheduler, job.state, job.nodes]}}
print(json.dumps(said))
"""


def test_four_ranks_on_two_ray_nodes_train_as_torchrun_ranks(ray_cluster: RayCluster, tmp_path: Path) -> None:
    code = RUN.format(tests=str(TESTS), root=str(tmp_path), address=ray_cluster.address)
    out = _finish(_driver(ray_cluster, code))
    assert out["state"] == "SUCCEEDED", out
    envs = [v["env"] for v in out["values"]]
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["GROUP_RANK"] for e in envs] == ["0", "0", "1", "1"], envs
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"], envs
    assert {e["WORLD_SIZE"] for e in envs} == {"4"} and {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    params = [v["params"] for v in out["values"]]
    assert all(p == params[0] for p in params), params  # DDP kept every rank's model the same
    scheduler, state, nodes = out["job"]
    assert scheduler == "ray" and state == "COMPLETED" and len(nodes.split(",")) == 2, out["job"]
    assert ray_cluster.placement_groups() and set(ray_cluster.placement_groups()) == {"REMOVED"}


LONG = """
import json, sys
sys.path.insert(0, {tests!r})
import orch
from orch.views.waiting import wait_for
run = orch.launch("jobs:allreduce_steps", world_size=4, run_root={root!r},
                  config={{"steps": 100000, "sleep": 0.05}},
                  cluster=orch.Ray(address={address!r}, nodes=2, ranks_per_node=2))
going = lambda: run.state().state.value == "RUNNING" and min(r.step for r in run.state().ranks) >= 2
assert wait_for(going, 180)
print(json.dumps({{"ranks": [r.pid for r in run.state().ranks], "run_dir": str(run.run_dir)}}), flush=True)
what = sys.stdin.readline().strip()
if what == "stop":
    run.stop()
    result = run.wait(timeout=120)
    run.close()
    print(json.dumps({{"state": result.state.value}}))
"""


def test_stop_ends_a_ray_run_stopped_and_leaves_nothing_in_the_cluster(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    proc = _driver(
        ray_cluster, LONG.format(tests=str(TESTS), root=str(tmp_path), address=ray_cluster.address)
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        ranks = json.loads(proc.stdout.readline())["ranks"]
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        assert _finish(proc)["state"] == "STOPPED"
        assert not _gone(ranks, 20)
        assert set(ray_cluster.placement_groups()) == {"REMOVED"} and ray_cluster.actors_alive() == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_launcher_killed_alone_leaves_no_group_actor_or_rank_within_20_s(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    proc = _driver(
        ray_cluster, LONG.format(tests=str(TESTS), root=str(tmp_path), address=ray_cluster.address)
    )
    try:
        assert proc.stdout is not None
        ranks = json.loads(proc.stdout.readline())["ranks"]
        os.kill(proc.pid, signal.SIGKILL)  # the launcher alone: Ray's driver, the run's master
        proc.wait(10)
        killed = time.monotonic()
        left = _gone(ranks, 20)
        assert not left, f"ranks {left} outlived their launcher by 20 s"
        while time.monotonic() - killed < 20 and (
            ray_cluster.actors_alive() or set(ray_cluster.placement_groups()) - {"REMOVED"}
        ):
            time.sleep(0.5)
        assert ray_cluster.actors_alive() == 0, "an actor of the run outlived its launcher"
        assert set(ray_cluster.placement_groups()) <= {"REMOVED"}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


TOO_BIG = """
import json, sys, time
sys.path.insert(0, {tests!r})
import orch
t0 = time.monotonic()
try:
    orch.launch("jobs:allreduce_steps", world_size=6, run_root={root!r}, startup_timeout=15,
                cluster=orch.Ray(address={address!r}, nodes=3, ranks_per_node=2))
    said = "launched"
except orch.ConfigError as e:
    said = str(e)
print(json.dumps({{"said": said, "after": time.monotonic() - t0}}))
"""


def test_a_placement_the_cluster_cannot_give_is_an_error_naming_what_is_missing(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    out = _finish(
        _driver(
            ray_cluster, TOO_BIG.format(tests=str(TESTS), root=str(tmp_path), address=ray_cluster.address)
        )
    )
    said = out["said"]
    assert "could not place 3 Ray node(s) of 2 ranks" in said, said
    assert "2 of its 2 live node(s) hold 2 CPU" in said and "STRICT_SPREAD" in said, said
    assert out["after"] < 15 + 30, out  # within startup_timeout, not a hang
    assert set(ray_cluster.placement_groups()) <= {"REMOVED"}


NODE_LOST = """
import json, sys
sys.path.insert(0, {tests!r})
import orch
from orch.views.waiting import wait_for
run = orch.launch("jobs:landscape_job", world_size=4, run_root={root!r}, max_restarts={restarts},
                  min_world_size={floor}, heartbeat_timeout=20,
                  config={{"x": 0, "steps": 40, "every": 5, "sleep": 0.2, "trace": {trace!r}}},
                  cluster=orch.Ray(address={address!r}, nodes=2, ranks_per_node=2))
going = lambda: run.state().state.value == "RUNNING" and min(r.step for r in run.state().ranks) >= 12
assert wait_for(going, 180)
print(json.dumps({{"ranks": [r.pid for r in run.state().ranks]}}), flush=True)
try:
    state, failure = run.wait(timeout=240).state.value, ""
except orch.RunFailed as e:
    state, failure = "FAILED", str(e)
mirror = run.state()
run.close()
print(json.dumps({{"state": state, "failure": failure, "world_size": mirror.world_size,
                  "attempt": mirror.attempt, "events": [[e[1], e[3]] for e in mirror.events],
                  "ranks": [[r.rank, r.state.value, r.error] for r in mirror.ranks]}}))
"""


def _lose_a_node(
    cluster: RayCluster, tmp_path: Path, restarts: int, floor: int | None
) -> tuple[dict, list[str]]:
    """A 2 x 2 run whose second node's raylet is SIGKILLed at step 12 (past a checkpoint at 10)."""
    trace = tmp_path / "trace.txt"
    code = NODE_LOST.format(
        tests=str(TESTS), root=str(tmp_path), restarts=restarts, floor=floor, trace=str(trace),
        address=cluster.address,
    )  # fmt: skip
    proc = _driver(cluster, code)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        ranks = json.loads(line)["ranks"]
        raylet = cluster.second_raylet()
        raylet.kill()  # the node's raylet alone, as a node lost: Ray ends what ran on it
        out = _finish(proc)
        assert not _gone(ranks, 30) or out["state"] == "SUCCEEDED"
        return out, trace.read_text().split("\n")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        cluster.add_node()  # the cluster's two nodes again, for the tests after this one


def test_a_lost_ray_node_restarts_the_run_on_the_nodes_left_from_its_checkpoint(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """max_restarts=1, min_world_size=2: the run goes on as 2 ranks on the node left, from its
    last checkpoint, told at once by its launcher which node went (not a heartbeat timeout later)."""
    out, trace = _lose_a_node(ray_cluster, tmp_path, restarts=1, floor=2)
    assert out["state"] == "SUCCEEDED", out
    assert out["attempt"] == 2 and out["world_size"] == 2, out
    resized = [m for kind, m in out["events"] if kind == "resized"]
    assert len(resized) == 1 and "is gone (Ray node " in resized[0], out["events"]
    assert "its actor " in resized[0] and "the next attempt runs on the 2 ranks left" in resized[0], resized
    named = [m for kind, m in out["events"] if kind == "rank_failed" and "its host is gone: Ray node" in m]
    assert named, out["events"]  # the lost node's ranks, named by it
    # Rank 0 traced each step it ran: past step 12 on the first attempt, then the second went
    # on from the last checkpoint (every 5 steps), not from 0, to the last step.
    steps = [int(line.split()[1]) for line in trace if line]
    back = next(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])
    assert steps[:back] == list(range(back)) and back > 12, steps
    resumed = steps[back]
    assert resumed >= 10 and resumed % 5 == 0 and resumed <= steps[back - 1] + 1, steps
    assert steps[back:] == list(range(resumed, 40)), steps
    assert set(ray_cluster.placement_groups()) <= {"REMOVED"} and ray_cluster.actors_alive() == 0


def test_a_lost_ray_node_the_run_cannot_restart_without_fails_it_naming_the_node(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """max_restarts=1 without min_world_size: the restart needs every node, and the failure
    names the one lost; the job's view names it too."""
    out, _ = _lose_a_node(ray_cluster, tmp_path, restarts=1, floor=None)
    assert out["state"] == "FAILED", out
    assert (
        "is gone (Ray node " in out["failure"] and "the group cannot restart without it" in out["failure"]
    ), out
    jobs = [m for kind, m in out["events"] if kind == "job" and re.search(r"node \d lost \(Ray node ", m)]
    assert jobs, out["events"]
    assert set(ray_cluster.placement_groups()) <= {"REMOVED"} and ray_cluster.actors_alive() == 0


HANG = """
import json, sys
sys.path.insert(0, {tests!r})
import orch
from orch.views.waiting import wait_for
run = orch.launch("jobs:hang_rank1", world_size=4, run_root={root!r}, config={{"at": 10}}, hang_timeout=5,
                  cluster=orch.Ray(address={address!r}, nodes=2, ranks_per_node=2))
assert wait_for(lambda: run.state().stacks, 120)
mirror = run.state()
run.stop()
try:
    state = run.wait(timeout=120).state.value
except orch.RunFailed as e:
    state = "FAILED: " + str(e)
run.close()
print(json.dumps({{"stacks": mirror.stacks, "note": mirror.progress_note, "state": state}}))
"""


def test_a_hang_on_ray_is_shown_with_the_stacks_of_both_nodes_ranks(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    out = _finish(
        _driver(ray_cluster, HANG.format(tests=str(TESTS), root=str(tmp_path), address=ray_cluster.address))
    )
    assert "no progress for" in out["note"] and "ranks 0-3 at step 10" in out["note"], out
    # rank 1 (node 0) blocks in its own code; ranks 0 (node 0) and 2, 3 (node 1) wait for it
    assert "rank 1 (the odd one out): in `time.sleep(10**6)`" in out["stacks"], out["stacks"]
    assert "ranks 0, 2, 3: in `loss.backward()`" in out["stacks"], out["stacks"]
    assert out["state"] == "STOPPED", out
    assert set(ray_cluster.placement_groups()) <= {"REMOVED"} and ray_cluster.actors_alive() == 0


GANG = """
import json, os, sys
sys.path.insert(0, {tests!r})
import psutil, torch
import orch, jobs
from ray._private.state import actors
cluster = orch.Ray(address={address!r}, nodes=2, ranks_per_node=2)
with orch.gang(world_size=4, cluster=cluster, run_root={root!r}) as gang:
    gang.run(jobs.gang_build).wait(timeout=120)
    where = gang.run(jobs.gang_where).wait(timeout=120).values
    results = [gang.run(jobs.gang_train, 5).wait(timeout=120) for _ in range(3)]
    again = gang.run(jobs.gang_where).wait(timeout=120).values
    nodes = {{a["Pid"]: a["Address"]["NodeID"] for a in actors().values() if a["State"] == "ALIVE"}}
    node_of = [nodes.get(psutil.Process(w["pid"]).ppid()) for w in where]
    try:
        gang.run(jobs.gang_train_rank1_fails).wait(timeout=120)
        failed = ""
    except orch.RunFailed as e:
        failed = str(e)
    after = gang.run(jobs.gang_where).wait(timeout=120).values
    remakes = gang.remakes
    pids = [w["pid"] for w in where]
with orch.launch("jobs:gang_in_one_run", world_size=4, config={{"steps": 5}}, run_root={root!r},
                 cluster=cluster) as run:
    one = run.wait(timeout=200).value
last = results[-1].value
print(json.dumps({{
    "where": where, "again": again, "after": after, "node_of": node_of, "failed": failed,
    "remakes": remakes, "pids": pids, "losses": [r.final_loss[0] for r in results],
    "same": all(torch.allclose(v, one[k], atol=1e-6) for k, v in last.items()),
}}))
"""


def test_a_gang_on_ray_keeps_its_ranks_across_calls_and_ends_where_one_run_ends(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """orch.gang(cluster=orch.Ray(...)): two ranks on each of the two nodes, in the same processes
    call after call; three training calls end where one run of the same steps ends (1e-6); a
    call whose rank 1 fails while the others wait in the all-reduce is mended in the same
    processes; close() leaves no actor, group or rank."""
    out = _finish(
        _driver(ray_cluster, GANG.format(tests=str(TESTS), root=str(tmp_path), address=ray_cluster.address))
    )
    assert [w["rank"] for w in out["where"]] == [0, 1, 2, 3]
    nodes = out["node_of"]
    assert None not in nodes and nodes[0] == nodes[1] != nodes[2] == nodes[3], nodes  # 2 ranks on each node
    assert out["again"] == out["where"] and out["after"] == out["where"]  # the same processes all along
    losses = out["losses"]
    assert losses[0] > losses[1] > losses[2], losses
    assert out["same"], "three gang calls did not end where one run of the same steps ends"
    assert "bad batch on rank 1" in out["failed"] and out["remakes"] == 1, out
    assert not _gone(out["pids"], 20)
    assert set(ray_cluster.placement_groups()) <= {"REMOVED"} and ray_cluster.actors_alive() == 0
