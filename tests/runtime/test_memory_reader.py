"""orch.runtime.memory: what a worker reads of its process at each beat, on made-up /proc and
cgroup trees (v1 and v2), so that every limit's files are read as the kernel lays them out."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from orch.runtime import memory
from orch.runtime.memory import PAGE, OomCounter, ProcessReader, find_cgroup


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def proc_tree(tmp_path: Path, cgroup: str, *, pid: str = "self") -> Path:
    proc = tmp_path / "proc"
    write(proc / pid / "statm", "250000 50000 3000 1 0 40000 0\n")  # size, resident (pages)
    write(proc / pid / "cgroup", cgroup)
    write(proc / "meminfo", "MemTotal:       16000000 kB\nMemFree: 1 kB\nMemAvailable:    8000000 kB\n")
    return proc


def test_v2_the_tightest_ancestor_limit_less_inactive_cache_and_the_oom_kills(tmp_path: Path) -> None:
    proc = proc_tree(tmp_path, "0::/job/step\n")
    cg = tmp_path / "cg"
    write(cg / "job/memory.max", "1000000000\n")
    write(cg / "job/memory.current", "950000000\n")
    write(cg / "job/memory.stat", "anon 800000000\ninactive_file 100000000\nactive_file 1\n")
    write(cg / "job/step/memory.max", "max\n")
    write(cg / "job/step/memory.current", "900000000\n")
    write(cg / "job/step/memory.events", "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n")
    stats = ProcessReader(root=cg, proc=proc).read()
    assert stats.rss_bytes == 50000 * PAGE
    assert (stats.limit_kind, stats.memory_limit, stats.limit_used) == ("cgroup", 1_000_000_000, 850_000_000)
    assert stats.oom_kills == 2
    assert stats.cuda_total == 0  # no CUDA device given: torch.cuda is never asked


def test_v1_memory_controller_and_its_oom_control(tmp_path: Path) -> None:
    proc = proc_tree(tmp_path, "4:memory:/a\n1:cpu:/\n0::/\n")
    cg = tmp_path / "cg"
    write(cg / "memory/a/memory.limit_in_bytes", "9223372036854771712\n")  # no limit of its own
    write(cg / "memory/memory.limit_in_bytes", "2000000000\n")
    write(cg / "memory/memory.usage_in_bytes", "1900000000\n")
    write(cg / "memory/memory.stat", "cache 5\ntotal_inactive_file 100000000\n")
    write(cg / "memory/a/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    stats = ProcessReader(root=cg, proc=proc).read()
    assert (stats.limit_kind, stats.memory_limit, stats.limit_used) == (
        "cgroup",
        2_000_000_000,
        1_800_000_000,
    )
    assert stats.oom_kills == 1


def test_without_a_cgroup_limit_the_machines_memory_is_the_limit(tmp_path: Path) -> None:
    proc = proc_tree(tmp_path, "0::/\n")
    stats = ProcessReader(root=tmp_path / "none", proc=proc).read()
    assert (stats.limit_kind, stats.memory_limit, stats.limit_used) == (
        "machine",
        16_384_000_000,
        8_192_000_000,
    )


def test_rlimit_as_counts_the_address_space_and_wins_when_it_has_least_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = proc_tree(tmp_path, "0::/\n")
    monkeypatch.setattr(
        memory.resource, "getrlimit", lambda what: (250000 * PAGE * 10 // 9, resource.RLIM_INFINITY)
    )
    stats = ProcessReader(root=tmp_path / "none", proc=proc).read()
    assert (stats.limit_kind, stats.limit_used) == ("RLIMIT_AS", 250000 * PAGE)


def test_a_reading_that_fails_leaves_the_beat_with_zeros(tmp_path: Path) -> None:
    stats = ProcessReader(root=tmp_path, proc=tmp_path / "no-proc").read()
    assert stats.rss_bytes == 0 and stats.memory_limit == 0


def test_the_memory_metric_has_a_point_a_second_at_most_and_only_when_the_step_moved(tmp_path: Path) -> None:
    reader = ProcessReader(root=tmp_path, proc=proc_tree(tmp_path, "0::/\n"))
    stats = reader.read()
    [point] = reader.points(stats, 5, 100.0)
    assert (point.name, list(point.steps), list(point.values)) == ("rank/memory", [5], [50000 * PAGE / 1e6])
    assert reader.points(stats, 5, 102.0) == []  # the same step
    assert reader.points(stats, 6, 100.5) == []  # within the second
    assert [p.steps[0] for p in reader.points(stats, 7, 101.0)] == [7]


def test_the_oom_counter_sees_a_kill_counted_after_the_worker_started(tmp_path: Path) -> None:
    proc = proc_tree(tmp_path, "0::/job\n", pid="4242")
    cg = tmp_path / "cg"
    write(cg / "job/memory.max", "1000000\n")
    write(cg / "job/memory.events", "oom 0\noom_kill 0\n")
    counter = OomCounter(4242, root=cg, proc=proc)
    assert not counter.rose()
    write(cg / "job/memory.events", "oom 1\noom_kill 1\n")
    assert counter.rose()
    assert OomCounter(99999999, root=cg, proc=proc).rose() is False  # no such process: no cgroup


def test_this_machines_own_process_reads(tmp_path: Path) -> None:
    # The real /proc: whatever its cgroup layout, RSS and a limit are read.
    stats = ProcessReader().read()
    assert stats.rss_bytes > 10_000_000 and stats.memory_limit > 0 and stats.limit_kind
    assert find_cgroup("self") is None or find_cgroup("self").path.is_dir()  # type: ignore[union-attr]
