"""Runs on a real Ray cluster of two nodes on this machine (tests/raycluster.py): a placement
group of one bundle per node, an actor per node running orch's host agent, ranks with
torchrun's contract, Stop, the launcher's death, and a placement the cluster cannot give.
Each run's launcher is a process of its own (the Ray driver), as a notebook kernel is."""

from __future__ import annotations

import json
import os
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
    return json.loads(out.strip().splitlines()[-1])


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
from orch.views.panel import wait_for
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
