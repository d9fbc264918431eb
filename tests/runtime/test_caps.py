"""What a rank logs is kept, or refused at the call, or dropped and counted: never lost in
silence. The caps (docs/python-api.md, "Caps") on real runs and on the heartbeat thread."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

import orch
from orch.record.metrics_log import read_metrics
from orch.runtime._sender import HeartbeatSender
from orch.runtime.agent import _batch
from orch.runtime.context import Context
from orch.runtime.context_log import USER_METRICS
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.limits import MAX_BATCH_BYTES, MAX_ERROR_LEN, MAX_VALUES_PER_BEAT
from orch.wire.ranks import RankView
from orch.wire.states import RankState, RunState

pytestmark = pytest.mark.timeout(300)

MASTER_LIMIT = 16 * 1024 * 1024  # the largest message the master takes (orch/master/server.py)


def _context(stub: Any = None) -> tuple[Context, HeartbeatSender]:
    sender = HeartbeatSender(
        stub, run_id="r", worker_id="w", on_stop=lambda at: None, on_abort=lambda reason: None
    )
    ctx = Context(
        rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), config={}, run_id="r", sender=sender
    )
    return ctx, sender


# -- at the call --------------------------------------------------------------------------
def test_ctx_log_takes_a_thousand_names_and_refuses_the_one_past_the_cap() -> None:
    ctx, sender = _context()
    ctx.log(0, **{f"grad_norm/layer{i:04d}": 1.0 for i in range(1000)})
    ctx.log(1, **{f"more/{i:04d}": 1.0 for i in range(USER_METRICS - 1000)})
    assert USER_METRICS == 2046
    with pytest.raises(ValueError) as e:
        ctx.log(2, loss=1.0, **{"more/0000": 2.0})
    assert "'loss' would be metric name number 2,047 of this rank" in str(e.value)
    assert "the cap is 2,046 different names per rank" in str(e.value)
    assert len(sender._queue) == 2  # the refused call logged nothing
    ctx.log(3, **{"more/0000": 2.0})  # a known name still goes


def test_ctx_log_refuses_a_name_past_256_characters_naming_it() -> None:
    ctx, sender = _context()
    ctx.log(0, **{"n" * 256: 1.0})
    with pytest.raises(ValueError) as e:
        ctx.log(1, **{"n" * 257: 1.0})
    assert "is 257 characters; the cap is 256" in str(e.value) and "'nnnnnnnnnn" in str(e.value)
    with pytest.raises(ValueError, match="not valid text"):
        ctx.log(1, **{"bad\ud800": 1.0})
    assert len(sender._queue) == 1


# -- the heartbeat thread ---------------------------------------------------------------------
def test_a_backlog_goes_in_beats_the_master_takes() -> None:
    """12 metrics with 100,000 points waiting (21 MiB in one beat before) go in beats of at
    most MAX_VALUES_PER_BEAT values, each well under the master's limit, every point once."""
    _, sender = _context()
    for step in range(100_000):
        sender.log(step, {f"m{i:02d}": step + 0.5 for i in range(12)})
    beats = []
    while sender._queue:
        beats.append(sender._request(sender._drain()))
    sizes = [b.ByteSize() for b in beats]
    assert max(sizes) < MASTER_LIMIT // 3, sizes
    assert all(sum(len(s.steps) for s in b.series) <= MAX_VALUES_PER_BEAT for b in beats)
    kept = Counter()
    for b in beats:
        for s in b.series:
            kept[s.name] += len(s.steps)
    assert kept == {f"m{i:02d}": 100_000 for i in range(12)}
    batches = []
    pending: list[tuple[pb.HeartbeatRequest, Any]] = [(b, None) for b in beats]
    while pending:
        batch = _batch(pending)
        del pending[: len(batch)]
        batches.append(pb.HostHeartbeatsRequest(beats=[b for b, _ in batch]).ByteSize())
    assert max(batches) <= MAX_BATCH_BYTES < MASTER_LIMIT and len(batches) < len(beats)


class _Refusing:
    """A master that refuses the first beat for what it carries, or (``code``) otherwise."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self.error = grpc.RpcError()
        self.error.code = lambda: code  # type: ignore[attr-defined]
        self.error.details = lambda: details  # type: ignore[attr-defined]
        self.requests: list[pb.HeartbeatRequest] = []

    def SendHeartbeat(self, request: pb.HeartbeatRequest, timeout: float) -> pb.HeartbeatResponse:
        self.requests.append(request)
        if len(self.requests) == 1:
            raise self.error
        return pb.HeartbeatResponse()


def test_a_refused_beat_is_dropped_and_counted_not_resent() -> None:
    master = _Refusing(grpc.StatusCode.INVALID_ARGUMENT, "every series needs a name of 1-256 characters")
    _, sender = _context(master)
    sender.log(0, {"loss": 1.0})
    sender.log(1, {"loss": 0.5})
    assert not sender._beat()
    assert sender.flush(timeout=5)  # one more beat: it carries the count and why
    first, told = master.requests
    assert list(first.series[0].steps) == [0, 1] and not told.series  # never sent again
    assert told.dropped_points == 2
    assert told.dropped_reason == (
        "the master refused a heartbeat of 2 points: every series needs a name of 1-256 characters"
    )


class _Taking:
    """A master that takes every beat and keeps it."""

    def __init__(self) -> None:
        self.requests: list[pb.HeartbeatRequest] = []

    def SendHeartbeat(self, request: pb.HeartbeatRequest, timeout: float = 0) -> pb.HeartbeatResponse:
        self.requests.append(request)
        return pb.HeartbeatResponse()


def test_a_bad_value_given_to_the_sender_itself_costs_only_that_point() -> None:
    master = _Taking()
    _, sender = _context(master)
    sender.log(0, {"loss": 1.0})
    sender.log(1, {"loss": "low"})  # type: ignore[dict-item]  # past ctx.log's checks
    sender.log(2, {"loss": 0.5})
    assert sender._beat()
    (beat,) = master.requests
    assert list(beat.series[0].steps) == [0, 2] and list(beat.series[0].values) == [1.0, 0.5]
    assert sender.dropped == 1


@pytest.mark.parametrize(
    "details", ["this orch master is serving 4096 SendHeartbeat calls already, its limit: retry later"]
)
def test_a_beat_turned_away_by_a_busy_master_goes_again(details: str) -> None:
    master = _Refusing(grpc.StatusCode.RESOURCE_EXHAUSTED, details)
    _, sender = _context(master)
    sender.log(0, {"loss": 1.0})
    assert not sender._beat()
    assert sender._beat()
    assert master.requests[0] is master.requests[1] and sender.dropped == 0


def test_a_full_queue_says_why_its_points_were_dropped() -> None:
    _, sender = _context()
    sender.max_queue = 3
    for step in range(5):
        sender.log(step, {"loss": 1.0})
    request = sender._request(sender._drain())
    assert request.dropped_points == 2
    assert request.dropped_reason.startswith("ctx.log's queue held 3 points not yet sent")


# -- real runs ------------------------------------------------------------------------------
def test_150_metrics_per_rank_past_the_heartbeat_timeout_are_all_kept(tmp_path: Path) -> None:
    """Each beat carries 151 names (the master took 64 before, refused every beat, and the
    run failed as "stuck in the rendezvous" once the heartbeat timeout passed)."""
    timeout = 3.0  # seconds: generous for a loaded machine, the run lasts 1.5 times it
    with orch.launch(
        "jobs:per_layer_norms",
        world_size=2,
        run_root=str(tmp_path),
        heartbeat_timeout=timeout,
        config={"seconds": timeout * 1.5},
    ) as run:
        result = run.wait(timeout=120)
    assert result.state is RunState.SUCCEEDED
    history = orch.load_run(run.run_dir).history()
    names = {n for n in history if n.startswith("grad_norm/")}
    assert len(names) == 150 and "loss" in history
    for rank in (0, 1):
        steps = history["loss"][rank]["step"]
        assert steps == list(range(len(steps))) and len(steps) > 20
        for name in names:
            assert history[name][rank]["step"] == steps, name
        assert run.coordinator.ranks[rank].dropped_points == 0


def test_a_name_past_the_cap_fails_the_run_naming_it(tmp_path: Path) -> None:
    with (
        orch.launch("jobs:long_metric_name", world_size=1, run_root=str(tmp_path)) as run,
        pytest.raises(orch.RunFailed) as e,
    ):
        run.wait(timeout=120)
    assert e.value.rank == 0
    assert "ValueError: ctx.log: the metric name 'mmmm" in e.value.traceback
    assert "is 300 characters; the cap is 256" in e.value.traceback
    assert orch.load_run(run.run_dir).history()["loss"][0]["value"] == [1.0]


def test_a_100_mb_exception_message_is_cut_and_named(tmp_path: Path) -> None:
    started = time.monotonic()
    with (
        orch.launch("jobs:huge_error_message_on_rank1", world_size=2, run_root=str(tmp_path)) as run,
        pytest.raises(orch.RunFailed) as e,
    ):
        run.wait(timeout=120)
    print(f"\n100 MB exception: the run ended {time.monotonic() - started:.1f}s after its launch")
    assert e.value.rank == 1
    tb = e.value.traceback
    assert len(tb) <= MAX_ERROR_LEN + 200
    assert "ValueError: 0.123456 0.123456" in tb and tb.rstrip().endswith("(end of the message)")
    assert "characters cut" in tb
    result = run.run_dir / "result.json"
    assert result.stat().st_size < 1024 * 1024, result.stat().st_size
    reply = run.coordinator.snapshot()
    assert reply.ByteSize() < 1024 * 1024
    stored = json.loads(result.read_text())
    assert stored["state"] == "FAILED" and "ValueError" in json.dumps(stored)


def test_a_21_mib_backlog_is_sent_whole(tmp_path: Path) -> None:
    with orch.launch("jobs:backlog_of_12_metrics", world_size=1, run_root=str(tmp_path)) as run:
        result = run.wait(timeout=180)
    assert result.state is RunState.SUCCEEDED
    kept = Counter()
    for record in read_metrics(run.run_dir / "metrics.pb"):
        for s in record.series:
            kept[s.name] += len(s.steps)
    assert {n: c for n, c in kept.items() if n.startswith("m")} == {f"m{i:02d}": 100_000 for i in range(12)}
    assert run.coordinator.ranks[0].dropped_points == 0


def test_a_refused_beat_keeps_the_rank_alive_and_is_counted(tmp_path: Path) -> None:
    timeout = 3.0  # seconds: generous for a loaded machine, the run lasts 1.5 times it
    with orch.launch(
        "jobs:a_beat_the_master_refuses",
        world_size=1,
        run_root=str(tmp_path),
        heartbeat_timeout=timeout,
        config={"seconds": timeout * 1.5},
    ) as run:
        result = run.wait(timeout=120)
    assert result.state is RunState.SUCCEEDED
    rank: RankView = orch.load_run(run.run_dir).state().ranks[0]  # as result.json keeps it
    assert rank.state is RankState.SUCCEEDED and rank.dropped_points == 1
    assert "the master refused a heartbeat of 1 points: every series needs a name of 1-256" in (
        rank.dropped_reason
    )
    steps = orch.load_run(run.run_dir).history()["loss"][0]["step"]
    assert steps == list(range(len(steps))) and len(steps) > 20
