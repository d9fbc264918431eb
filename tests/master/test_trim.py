"""orch.master._trim: the allocator's free pages go back to the system once a flood's memory is
freed, by one thread per process while a master serves. What it gives back is measured in
benchmarks/connection_flood.py; here, when it trims and who holds it."""

from __future__ import annotations

import pytest

from orch.master import _trim
from orch.master.control.plan import RunPlan
from orch.master.coordinator import Coordinator
from orch.master.server import MasterServer

MIB = 2**20


class FakeAllocator:
    def __init__(self, in_use: int = 0) -> None:
        self.bytes = in_use
        self.trims = 0

    def in_use(self) -> int:
        return self.bytes

    def trim(self) -> None:
        self.trims += 1


def test_a_trim_is_due_once_the_bytes_in_use_fell_by_the_drop_from_their_highest() -> None:
    mark = _trim.Watermark(drop=32 * MIB, follow=MIB)
    assert not mark.trim_now(60 * MIB)
    assert not mark.trim_now(370 * MIB)  # a flood: memory in use rises
    assert not mark.trim_now(350 * MIB)  # some of it freed: not enough to be worth it
    assert mark.trim_now(13 * MIB)  # the flood is gone
    assert mark.highest == 13 * MIB
    assert not mark.trim_now(13 * MIB)  # nothing freed since: no trim again
    assert not mark.trim_now(40 * MIB) and not mark.trim_now(9 * MIB)  # 31 MiB freed
    assert mark.trim_now(8 * MIB)


def test_while_a_floods_connections_keep_going_each_look_trims_what_they_freed() -> None:
    mark = _trim.Watermark(drop=32 * MIB, follow=MIB)
    assert not mark.trim_now(370 * MIB)
    assert mark.trim_now(300 * MIB)  # the idle close has begun
    assert mark.trim_now(290 * MIB)  # 10 MiB more since: less than the drop, trimmed too
    assert mark.trim_now(20 * MIB)
    assert not mark.trim_now(20 * MIB - MIB // 2)  # they stopped falling
    # From there a trim waits for a drop again: a slow fall is not followed.
    assert not mark.trim_now(18 * MIB) and not mark.trim_now(16 * MIB)
    assert not mark.trim_now(40 * MIB) and mark.trim_now(8 * MIB)


def test_the_trimmer_trims_when_due_and_only_then() -> None:
    allocator = FakeAllocator(10 * MIB)
    trimmer = _trim.Trimmer(allocator, drop=32 * MIB)
    assert not trimmer.check()
    allocator.bytes = 300 * MIB
    assert not trimmer.check()
    allocator.bytes = 12 * MIB
    assert trimmer.check() and allocator.trims == 1 == trimmer.trims
    assert not trimmer.check() and allocator.trims == 1


def test_glibc_is_read_and_trimmed_through_ctypes() -> None:
    glibc = _trim.Glibc.load()
    if glibc is None:
        pytest.skip("this C library is not glibc (no mallinfo2/malloc_trim): nothing to trim")
    assert glibc.in_use() > 0
    glibc.trim()


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """No master of another test holds the trimmer here, and the allocator is a fake."""
    monkeypatch.setattr(_trim, "_users", 0)
    monkeypatch.setattr(_trim, "_running", None)
    monkeypatch.setattr(_trim.Glibc, "load", classmethod(lambda cls: FakeAllocator()))


@pytest.mark.usefixtures("fresh")
def test_one_trimmer_serves_every_master_of_the_process_and_ends_with_the_last() -> None:
    _trim.hold()
    first = _trim.running()
    assert first is not None and first._thread.is_alive()
    _trim.hold()
    assert _trim.running() is first
    _trim.release()
    assert _trim.running() is first and first._thread.is_alive()
    _trim.release()
    assert _trim.running() is None and not first._thread.is_alive()
    _trim.release()  # one release too many is not an error
    assert _trim.running() is None


@pytest.mark.usefixtures("fresh")
def test_without_glibc_nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_trim.Glibc, "load", classmethod(lambda cls: None))
    _trim.hold()
    try:
        assert _trim.running() is None
    finally:
        _trim.release()


@pytest.mark.usefixtures("fresh")
def test_a_master_holds_the_trimmer_while_it_serves() -> None:
    server = MasterServer(Coordinator(RunPlan(1)))
    with server:
        assert _trim.running() is not None
    assert _trim.running() is None
    server.stop()  # a second stop does not release what it no longer holds
    assert _trim._users == 0
