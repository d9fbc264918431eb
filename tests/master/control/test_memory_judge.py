"""orch.master.control.memory and memory_watch: a rank's memory from its beats, the leak and
near-limit warnings, and whether a SIGKILL was the OOM killer's.

The samples are fed on a plain float clock, one beat a quarter second as workers send them.
"""

from __future__ import annotations

import math
import signal

from coordinator_calls import Clock, heartbeat, reg
from orch.master.control.memory import (
    LEAK_MIN_SPAN,
    WARMUP,
    MemoryWindow,
    oom_cause,
)
from orch.master.control.memory_watch import MemoryWatch
from orch.master.control.plan import RunPlan
from orch.master.control.registry import RankRecord
from orch.master.coordinator import Coordinator
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.client import StateMirror
from orch.wire.codec import encode
from orch.wire.model import ProcessStats
from orch.wire.states import RankState, RunState

MB = 1_000_000
GB = 1_000_000_000


def stats(
    rss: float, *, limit: float = 16 * GB, used: float = 0, kind: str = "machine", **kw: float
) -> ProcessStats:
    return ProcessStats(
        rss_bytes=int(rss),
        cpu_percent=95.0,
        memory_limit=int(limit),
        limit_kind=kind,
        limit_used=int(used or rss),
        **{k: int(v) for k, v in kw.items()},
    )


def feed(rss_at: object, seconds: float, *, start: float = 0.0) -> tuple[RankRecord, MemoryWindow]:
    """A running rank at step 1+ whose RSS at time t (from its first step) is ``rss_at(t)``."""
    rec = RankRecord(rank=1, state=RankState.RUNNING, step=1)
    t = start
    while t <= start + seconds:
        rec.step += 1
        rec.memory.take(rec, stats(rss_at(t - start)), t)  # type: ignore[operator]
        t += 0.25
    return rec, rec.memory


def test_a_beat_fills_the_ranks_memory_fields() -> None:
    rec = RankRecord(rank=0, step=3)
    rec.memory.take(rec, stats(2 * GB, cuda_allocated=3 * GB, cuda_reserved=4 * GB, cuda_total=80 * GB), 1.0)
    assert (rec.rss_bytes, rec.cpu_percent, rec.memory_limit, rec.limit_kind) == (
        2 * GB,
        95.0,
        16 * GB,
        "machine",
    )
    assert (rec.cuda_allocated, rec.cuda_reserved, rec.cuda_total) == (3 * GB, 4 * GB, 80 * GB)
    assert rec.to_pb().rss_bytes == 2 * GB  # and it reaches the protocol's RankInfo


def test_a_steady_leak_is_judged_a_leak_with_its_rate_and_when_it_meets_the_limit() -> None:
    rec, window = feed(lambda t: 400 * MB + 20 * MB * t, WARMUP + LEAK_MIN_SPAN + 1)
    note, news = window.judge(rec)
    assert note.startswith("memory grows steadily: RSS ") and "(+20 MB/s)" in note, note
    assert "at this rate its machine's memory (16.0 GB) is reached in" in note
    assert [k for k, _ in news] == ["leak"]
    assert window.judge(rec)[1] == []  # told once


def test_a_leak_is_not_judged_from_fewer_seconds_than_the_minimum_span() -> None:
    rec, window = feed(lambda t: 400 * MB + 20 * MB * t, WARMUP + LEAK_MIN_SPAN - 2)
    assert window.judge(rec) == ("", [])


def test_a_healthy_run_growing_in_its_first_steps_then_wobbling_is_no_leak() -> None:
    # Grows by 300 MB over its first 4 s (optimizer state, allocator pools), then wobbles by
    # up to 40 MB as each step's garbage is made and freed, for two minutes.
    def rss(t: float) -> float:
        grown = 300 * MB * min(t, 4.0) / 4.0
        return 500 * MB + grown + 40 * MB * math.sin(t * 2.7) ** 2

    rec, window = feed(rss, 120)
    assert window.judge(rec) == ("", [])


def test_one_jump_then_flat_is_no_leak() -> None:
    # A cache filled once, 500 MB at 20 s: it rose in one second only.
    rec, window = feed(lambda t: 600 * MB + (500 * MB if t > 20 else 0) + (t * 7 % 3) * MB, 60)
    assert window.judge(rec) == ("", [])


def test_a_slow_rise_below_the_minimum_growth_is_no_leak() -> None:
    rec, window = feed(lambda t: 600 * MB + 0.5 * MB * t, 70)  # 30 MB a minute
    assert window.judge(rec) == ("", [])


def test_near_its_limit_a_rank_is_warned_once_and_the_note_follows_what_holds_now() -> None:
    rec = RankRecord(rank=0, step=5)
    rec.memory.take(rec, stats(7 * GB, limit=8 * GB, used=7.6 * GB, kind="cgroup"), 1.0)
    note, news = rec.memory.judge(rec)
    assert note == "near its cgroup limit: 7.6 GB of 8.0 GB in use (95%)"
    assert news == [("limit", note)]
    rec.memory.take(rec, stats(7 * GB, limit=8 * GB, used=7.7 * GB, kind="cgroup"), 2.0)
    assert rec.memory.judge(rec)[1] == []
    rec.memory.take(rec, stats(3 * GB, limit=8 * GB, used=3 * GB, kind="cgroup"), 3.0)
    assert rec.memory.judge(rec) == ("", [])


def test_a_nearly_full_gpu_is_warned() -> None:
    rec = RankRecord(rank=0, step=5)
    rec.memory.take(
        rec, stats(2 * GB, cuda_reserved=79 * GB, cuda_total=80 * GB, cuda_allocated=70 * GB), 1.0
    )
    note, news = rec.memory.judge(rec)
    assert note == "GPU memory nearly full: 79.0 GB of 80.0 GB in use (99%) reserved by torch" and news


def test_the_oom_cause_names_the_rss_and_the_limit_or_nothing() -> None:
    rec = RankRecord(rank=0, step=5)
    rec.memory.take(rec, stats(21.9 * GB, limit=23.5 * GB, used=23.1 * GB, kind="cgroup"), 1.0)
    assert oom_cause(rec, rec.memory, False) == (
        "killed by the out-of-memory killer "
        "(RSS 21.9 GB at its last beat; cgroup limit 23.5 GB, 23.1 GB in use)"
    )
    low = RankRecord(rank=0, step=5)
    low.memory.take(low, stats(1 * GB, limit=23.5 * GB, used=4 * GB, kind="cgroup"), 1.0)
    assert oom_cause(low, low.memory, False) == ""
    assert oom_cause(low, low.memory, True).endswith("4.0 GB in use; its cgroup counted the kill)")


def test_the_watch_judges_running_ranks_at_most_once_a_second() -> None:
    rec, _ = feed(lambda t: 400 * MB + 20 * MB * t, WARMUP + LEAK_MIN_SPAN + 1)
    done = RankRecord(rank=2, state=RankState.SUCCEEDED)
    watch = MemoryWatch()
    told = watch.look([rec, done], 100.0)
    assert [r for r, _ in told] == [1] and rec.memory_note.startswith("memory grows steadily")
    assert watch.look([rec, done], 100.5) == []


def running_coordinator() -> tuple[Coordinator, Clock]:
    clock = Clock()
    c = Coordinator(RunPlan(2), run_id="r", clock=clock, wall=clock)
    reg(c, "w0")
    reg(c, "w1")
    for w in ("w0", "w1"):
        c.can_start(pb.CanStartTrainingRequest(run_id="r", worker_id=w))
    assert c.state is RunState.RUNNING
    return c, clock


def beat(c: Coordinator, wid: str, step: int, p: ProcessStats) -> None:
    heartbeat(c, pb.HeartbeatRequest(run_id="r", worker_id=wid, step=step, process=encode(p)))


def test_a_leaking_rank_gets_an_event_and_a_note_through_the_coordinator() -> None:
    c, clock = running_coordinator()
    for i in range(80):  # 20 s of beats; rank 1 leaks 20 MB a beat, rank 0 holds
        clock.t += 0.25
        beat(c, "w0", i + 1, stats(500 * MB + (i % 3) * MB))
        beat(c, "w1", i + 1, stats(500 * MB + 20 * MB * i))
        c.expire()
    m = StateMirror.of(c)
    assert m.ranks[1].memory_note.startswith("memory grows steadily") and not m.ranks[0].memory_note
    assert m.ranks[1].rss_bytes == 500 * MB + 20 * MB * 79 and m.ranks[1].cpu_percent == 95.0
    warnings = [e for e in m.events if e[1] == "memory"]
    assert [e[2] for e in warnings] == [1] and warnings[0][3].startswith("memory grows steadily: RSS 900 MB")


def test_a_sigkill_near_the_limit_is_reported_as_the_oom_killer() -> None:
    c, _ = running_coordinator()
    beat(c, "w1", 3, stats(21.9 * GB, limit=23.5 * GB, used=23.1 * GB, kind="cgroup"))
    c.rank_exited("w1", -signal.SIGKILL)
    assert c.failure.endswith(
        "failed: process exited with signal SIGKILL: killed by the out-of-memory killer "
        "(RSS 21.9 GB at its last beat; cgroup limit 23.5 GB, 23.1 GB in use)"
    ), c.failure


def test_a_sigkill_far_from_the_limit_is_told_as_before_unless_the_cgroup_counted_it() -> None:
    c, _ = running_coordinator()
    beat(c, "w1", 3, stats(1 * GB, limit=23.5 * GB, used=2 * GB, kind="cgroup"))
    c.rank_exited("w1", -signal.SIGKILL)
    assert c.failure.endswith("failed: process exited with signal SIGKILL"), c.failure
    c, _ = running_coordinator()
    beat(c, "w1", 3, stats(1 * GB, limit=23.5 * GB, used=2 * GB, kind="cgroup"))
    c.rank_exited("w1", -signal.SIGKILL, oom_killed=True)
    assert "killed by the out-of-memory killer" in c.failure and "its cgroup counted the kill" in c.failure


def test_a_sigkill_the_launcher_sent_is_not_blamed_on_memory() -> None:
    c, _ = running_coordinator()
    beat(c, "w1", 3, stats(21.9 * GB, limit=23.5 * GB, used=23.1 * GB, kind="cgroup"))
    c.rank_exited("w0", 1)
    c.rank_exited("w1", -signal.SIGKILL, expected=True)
    assert "out-of-memory" not in c.ranks[1].error
