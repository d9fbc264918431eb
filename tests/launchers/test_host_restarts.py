"""Restarts across hosts, as the master decides them (no sockets, an injected clock).

The host agents call ``SyncHost``; once the failed attempt's ranks ended on every host, the
master opens the next attempt and tells each agent to start its ranks again. A host that falls
silent, or a rank no agent started, ends the run instead, named.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

import orch
from conftest import ORCH, until_value
from coordinator_calls import Clock, beat, complete, reg
from orch.master.control.plan import RunPlan
from orch.master.control.validate import Reject
from orch.master.coordinator import Coordinator
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.client import StateMirror
from orch.wire.states import RunState


def sync(c: Coordinator, host: str, attempt: int, running: bool, *workers: str) -> pb.HostSyncResponse:
    return c.sync_host(pb.HostSyncRequest(host=host, attempt=attempt, worker_ids=workers, running=running))


def running_on_two_hosts(clock: Clock, max_attempts: int = 2) -> Coordinator:
    """Four ranks, two on each of hosts a and b (their agents said so), past the barrier and at step 5."""
    c = Coordinator(
        RunPlan(4, heartbeat_timeout=5.0, max_attempts=max_attempts, restart_through_hosts=True),
        run_id="r1",
        clock=clock,
    )
    for host, workers in (("a:1", ("a0", "a1")), ("b:2", ("b0", "b1"))):
        first = sync(c, host, 0, False)
        assert (first.action, first.attempt, first.restarts) == (pb.HOST_START, 1, max_attempts > 1)
        assert sync(c, host, 1, True, *workers).action == pb.HOST_CONTINUE
    for w in ("a0", "a1", "b0", "b1"):
        reg(c, w, host=w[0])
    for w in ("a0", "a1", "b0", "b1"):
        assert c.can_start(pb.CanStartTrainingRequest(run_id="r1", worker_id=w)).ready
        beat(c, w, step=5)
    return c


def test_a_failure_waits_for_every_host_then_opens_the_next_attempt() -> None:
    clock = Clock()
    c = running_on_two_hosts(clock)
    complete(c, "b1", pb.RANK_FAILED, "boom")
    assert c.state is RunState.RESTARTING
    # Host b's ranks ended; a's are still being torn down: b waits, a goes on ending its own.
    assert sync(c, "b:2", 1, False, "b0", "b1").action == pb.HOST_WAIT
    assert sync(c, "a:1", 1, True, "a0", "a1").action == pb.HOST_WAIT
    assert c.state is RunState.RESTARTING
    clock.t += 1
    reply = sync(c, "a:1", 1, False, "a0", "a1")
    assert c.state is RunState.PENDING and c.attempt == 2
    assert (reply.action, reply.attempt) == (pb.HOST_START, 2)
    assert (sync(c, "b:2", 1, False, "b0", "b1").action, c.attempt) == (pb.HOST_START, 2)
    # Once a host started the new attempt's ranks, it goes on.
    assert sync(c, "a:1", 2, True, "a0-a2", "a1-a2").action == pb.HOST_CONTINUE
    assert any(e.kind == "restart" for e in c.events)


def test_a_silent_host_fails_the_run_with_its_name() -> None:
    clock = Clock()
    c = running_on_two_hosts(clock)
    complete(c, "a0", pb.RANK_FAILED, "boom")
    sync(c, "a:1", 1, False, "a0", "a1")
    clock.t += 4.0
    c.expire()
    assert c.state is RunState.RESTARTING  # b's agent spoke 4 s ago: within the 5 s timeout
    clock.t += 2.0
    sync(c, "a:1", 1, False, "a0", "a1")
    assert c.state is RunState.FAILED
    failure = StateMirror.of(c).failure
    assert failure.startswith("rank 0 (host a") and "boom" in failure, failure
    assert failure.endswith(
        "(host b fell silent, no word from its agent for more than 5s: the group cannot restart without it)"
    )
    assert sync(c, "a:1", 1, False, "a0", "a1").action == pb.HOST_EXIT


def test_a_rank_that_no_agent_started_cannot_be_restarted() -> None:
    clock = Clock()
    c = Coordinator(
        RunPlan(2, heartbeat_timeout=5.0, max_attempts=2, restart_through_hosts=True),
        run_id="r1",
        clock=clock,
    )
    sync(c, "a:1", 0, False)
    sync(c, "a:1", 1, True, "a0")
    reg(c, "a0", host="a")
    reg(c, "lone", host="z")  # a plain `orch worker`, or one torchrun started
    for w in ("a0", "lone"):
        c.can_start(pb.CanStartTrainingRequest(run_id="r1", worker_id=w))
        beat(c, w, step=3)
    complete(c, "a0", pb.RANK_FAILED, "boom")
    sync(c, "a:1", 1, False, "a0")
    assert c.state is RunState.FAILED
    assert "rank 1 (worker lone on z) was not started by a host agent" in StateMirror.of(c).failure


def test_no_host_agent_at_all_gives_up_at_the_next_tick() -> None:
    clock = Clock()
    c = Coordinator(
        RunPlan(1, heartbeat_timeout=5.0, max_attempts=2, restart_through_hosts=True),
        run_id="r1",
        clock=clock,
    )
    reg(c, "w0")
    c.can_start(pb.CanStartTrainingRequest(run_id="r1", worker_id="w0"))
    beat(c, "w0", step=3)
    complete(c, "w0", pb.RANK_FAILED, "boom")
    c.expire()
    assert c.state is RunState.FAILED
    assert "not started by a host agent" in StateMirror.of(c).failure


def test_a_stop_while_restarting_ends_the_run_stopped() -> None:
    clock = Clock()
    c = running_on_two_hosts(clock)
    complete(c, "a0", pb.RANK_FAILED, "boom")
    c.request_stop("user")
    sync(c, "a:1", 1, False, "a0", "a1")
    assert c.state is RunState.RESTARTING
    assert sync(c, "b:2", 1, False, "b0", "b1").action == pb.HOST_EXIT
    assert c.state is RunState.STOPPED and c.attempt == 1


def test_the_last_attempt_fails_the_run_and_the_agents_exit() -> None:
    clock = Clock()
    c = running_on_two_hosts(clock, max_attempts=1)
    complete(c, "a0", pb.RANK_FAILED, "boom")
    assert c.state is RunState.FAILED
    assert sync(c, "a:1", 1, False, "a0", "a1").action == pb.HOST_EXIT


def test_without_host_restarts_the_launcher_decides() -> None:
    """A run whose launcher restarts its own ranks (one machine) ignores the agents' idling."""
    clock = Clock()
    c = Coordinator(RunPlan(1, heartbeat_timeout=5.0, max_attempts=2), run_id="r1", clock=clock)
    reply = sync(c, "a:1", 0, False)
    assert not reply.restarts
    reg(c, "w0")
    c.can_start(pb.CanStartTrainingRequest(run_id="r1", worker_id="w0"))
    beat(c, "w0", step=3)
    complete(c, "w0", pb.RANK_FAILED, "boom")
    sync(c, "a:1", 1, False, "w0")
    c.expire()
    assert c.state is RunState.RESTARTING


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"host": ""}, "host is empty"),
        ({"host": "a:1", "attempt": -1}, "attempt must be >= 0"),
        ({"host": "a:1", "worker_ids": ["w"] * 5}, "names 5 workers; the run has only 4 ranks"),
        ({"host": "a:1", "worker_ids": [""]}, "worker_id is empty"),
        ({"host": "h" * 300}, "the limit is 256"),
    ],
)
def test_a_malformed_host_sync_is_invalid_argument(fields: dict[str, object], says: str) -> None:
    c = Coordinator(RunPlan(4), run_id="r1")
    with pytest.raises(Reject) as e:
        c.sync_host(pb.HostSyncRequest(**fields))  # type: ignore[arg-type]
    assert e.value.kind == "invalid_argument" and says in str(e.value), str(e.value)


def test_elastic_a_silent_host_is_left_out_while_enough_ranks_remain() -> None:
    clock = Clock()
    c = running_on_two_hosts(clock)
    c.min_world_size = 2
    complete(c, "b0", pb.RANK_FAILED, "boom")
    sync(c, "a:1", 1, False, "a0", "a1")
    clock.t += 6.0  # host b's agent is silent past the heartbeat timeout
    reply = sync(c, "a:1", 1, False, "a0", "a1")
    assert c.state is RunState.PENDING and c.attempt == 2 and c.world_size == 2
    assert (reply.action, reply.attempt) == (pb.HOST_START, 2)
    resized = [e.message for e in c.events if e.kind == "resized"]
    assert resized == [
        "host b fell silent, no word from its agent for more than 5s: "
        "the next attempt runs on the 2 ranks left"
    ]
    # Host a's two ranks make the whole new world; host b, should it call again, is told to exit.
    assert sync(c, "b:2", 1, False, "b0", "b1").action == pb.HOST_EXIT
    for w in ("a0-a2", "a1-a2"):
        reg(c, w, host="a")
    assert c.state is RunState.RUNNING


def test_a_host_its_launcher_knows_is_gone_ends_its_ranks_lost_and_is_left_out_at_once() -> None:
    """A cluster's launcher saw host b's node go (a Ray node's actor ended): no heartbeat
    timeout is waited out; b's ranks are LOST naming the node, and the restart runs on a."""
    clock = Clock()
    c = running_on_two_hosts(clock)
    c.min_world_size = 2
    assert not c.host_lost("c:9", "never called")  # a host the master never heard of
    assert c.host_lost("b:2", "Ray node 2b167c9b at 10.0.0.8: its actor died")
    mirror = StateMirror.of(c)
    lost = {r.rank: r for r in mirror.ranks if r.state.value == "LOST"}
    assert len(lost) == 2 and all("its host is gone: Ray node 2b167c9b" in r.error for r in lost.values())
    assert "was lost: its host is gone: Ray node 2b167c9b at 10.0.0.8" in mirror.failure, mirror.failure
    for w in ("a0", "a1"):  # a's ranks fail in their broken collective and end
        complete(c, w, pb.RANK_FAILED, "Connection closed by peer")
    reply = sync(c, "a:1", 1, False, "a0", "a1")  # no clock moved: b is not merely silent
    assert c.attempt == 2 and c.world_size == 2 and reply.action == pb.HOST_START
    resized = [e.message for e in c.events if e.kind == "resized"]
    assert resized == [
        "host b is gone (Ray node 2b167c9b at 10.0.0.8: its actor died): "
        "the next attempt runs on the 2 ranks left"
    ], resized


def test_a_host_gone_below_the_minimum_world_size_fails_the_run_naming_it() -> None:
    """Its launcher says so 3 s after a's ranks failed in their broken collective (past the
    2 s in which a better cause replaces the first, within b's 5 s heartbeat timeout): the
    failure names the node, not the peer error that came first."""
    clock = Clock()
    c = running_on_two_hosts(clock)
    for w in ("a0", "a1"):
        complete(c, w, pb.RANK_FAILED, "RuntimeError: Connection closed by peer")
    for _ in range(2):  # host a's agent goes on calling; b's says nothing
        clock.t += 1.5
        sync(c, "a:1", 1, False, "a0", "a1")
    assert c.state is RunState.RESTARTING  # b's ranks are not yet accounted for
    assert c.host_lost("b:2", "Ray node 2b167c9b at 10.0.0.8: its actor died")
    sync(c, "a:1", 1, False, "a0", "a1")
    assert c.state is RunState.FAILED
    failure = StateMirror.of(c).failure
    assert "was lost: its host is gone: Ray node 2b167c9b" in failure and "by peer" not in failure, failure
    assert (
        "host b is gone (Ray node 2b167c9b at 10.0.0.8: its actor died): the group cannot restart" in failure
    )


def test_elastic_gives_up_below_the_minimum_world_size() -> None:
    clock = Clock()
    c = running_on_two_hosts(clock)
    c.min_world_size = 3
    complete(c, "b0", pb.RANK_FAILED, "boom")
    sync(c, "a:1", 1, False, "a0", "a1")
    clock.t += 6.0
    sync(c, "a:1", 1, False, "a0", "a1")
    assert c.state is RunState.FAILED
    assert "(the 2 ranks left are fewer than min_world_size 3)" in StateMirror.of(c).failure


def test_a_stop_while_a_host_is_silent_still_ends_stopped() -> None:
    clock = Clock()
    c = running_on_two_hosts(clock)
    complete(c, "a0", pb.RANK_FAILED, "boom")
    c.request_stop("user")
    clock.t += 6.0  # host b silent past the timeout: no next attempt, so not waited for
    sync(c, "a:1", 1, False, "a0", "a1")
    assert c.state is RunState.STOPPED


def test_a_rank_that_died_before_registering_fails_the_attempt_naming_its_host() -> None:
    clock = Clock()
    c = running_on_two_hosts(clock)
    complete(c, "a0", pb.RANK_FAILED, "boom")
    sync(c, "a:1", 1, False, "a0", "a1")
    sync(c, "b:2", 1, False, "b0", "b1")
    assert c.state is RunState.PENDING and c.attempt == 2
    sync(c, "a:1", 2, True, "a0-a2", "a1-a2")
    reply = c.sync_host(
        pb.HostSyncRequest(
            host="b:2",
            attempt=2,
            worker_ids=["b0-a2", "b1-a2"],
            running=False,
            failure="the process of worker b0-a2 on b exited with signal SIGKILL before it registered",
        )
    )
    assert c.state is RunState.FAILED and reply.action == pb.HOST_EXIT and reply.state == pb.FAILED
    assert "host b: the process of worker b0-a2 on b exited with signal SIGKILL" in StateMirror.of(c).failure


def test_hosts_beyond_the_world_size_and_attempts_ahead_are_refused() -> None:
    c = Coordinator(RunPlan(2, max_attempts=2, restart_through_hosts=True), run_id="r1")
    sync(c, "a:1", 0, False)
    sync(c, "b:2", 0, False)
    with pytest.raises(Reject) as e:
        sync(c, "c:3", 0, False)
    assert e.value.kind == "resource_exhausted" and "2 hosts already joined a run of 2 ranks" in str(e.value)
    with pytest.raises(Reject) as e:
        sync(c, "a:1", 5, False)
    assert e.value.kind == "failed_precondition" and "attempt 5; the run is at 1" in str(e.value)


# -- real processes on loopback: `orch master --max-restarts 1` and host agents -----------------
def _master(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [ORCH, "master", "--port", "0", "--no-dashboard", "--linger", "0.5", "--run-root", str(tmp_path),
         "--heartbeat-timeout", "5", "--max-restarts", "1", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"serving on (\S+);", line)
    assert m, line + proc.stdout.read()
    return proc, m.group(1)


def _agent(tmp_path: Path, env: dict[str, str], address: str, name: str, nproc: int) -> subprocess.Popen[str]:
    with open(tmp_path / f"{name}.log", "w") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            [ORCH, "worker", "--master", address, "--nproc-per-node", str(nproc), "--fn", "jobs:checkpointed",
             "--run-root", str(tmp_path)],
            stdout=out, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
        )  # fmt: skip


def _ranks(address: str, env: dict[str, str], count: int) -> list[orch.wire.client.RankView]:
    def ready() -> list[Any] | None:
        with orch.MasterClient(address, token=env["ORCH_TOKEN"], timeout=5) as client:
            m = orch.StateMirror().poll(client)
        ok = m.state is RunState.RUNNING and len(m.ranks) == count and all(r.step > 14 for r in m.ranks)
        return m.ranks if ok else None

    return until_value(ready, 120)


def test_one_rank_per_host_agents_restart_the_group(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    """`--nproc-per-node 1` still runs a host agent: a rank killed on one host restarts both."""
    config = json.dumps({"steps": 60, "sleep": 0.05, "die_on_attempts": []})
    master, address = _master(tmp_path, subprocess_env, "--world-size", "2", "--fn", "jobs:checkpointed",
                              "--config", config)  # fmt: skip
    agents = [_agent(tmp_path, subprocess_env, address, name, 1) for name in ("a", "b")]
    try:
        ranks = _ranks(address, subprocess_env, 2)
        os.kill(ranks[1].pid, signal.SIGKILL)
        out, _ = master.communicate(timeout=180)
        assert master.returncode == 0, out
        assert [a.wait(timeout=60) for a in agents] == [0, 0]
        result = json.loads(next(tmp_path.glob("*/result.json")).read_text())
        assert (result["state"], result["attempt"]) == ("SUCCEEDED", 2)
    finally:
        for p in [master, *agents]:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_host_agent_told_to_end_exits_and_starts_no_next_attempt(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """SIGTERM to an agent (scancel, a supervisor) ends its ranks and the agent, even with
    restarts on: it does not wait for the master's next attempt."""
    config = json.dumps({"steps": 100000, "sleep": 0.05, "die_on_attempts": []})
    master, address = _master(tmp_path, subprocess_env, "--world-size", "2", "--fn", "jobs:checkpointed",
                              "--config", config)  # fmt: skip
    agent = _agent(tmp_path, subprocess_env, address, "a", 2)
    try:
        ranks = _ranks(address, subprocess_env, 2)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 143
        log = (tmp_path / "a.log").read_text()
        assert "attempt 2" not in log, log
        assert not any(psutil.pid_exists(r.pid) and psutil.Process(r.pid).status() != psutil.STATUS_ZOMBIE
                       for r in ranks)  # fmt: skip
        out, _ = master.communicate(timeout=60)  # its ranks lost: restart refused, run FAILED
        assert master.returncode == 1, out
    finally:
        for p in (master, agent):
            if p.poll() is None:
                p.kill()
                p.wait()
