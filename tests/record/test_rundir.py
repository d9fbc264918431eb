"""Reading a run dir back: damaged metrics logs, crafted JSON files, the points budget.

Run dirs are written by hand through RunStore, as a master would, then damaged on purpose.
"""

from __future__ import annotations

import csv
import json
import logging
import random
import struct
import time
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

import orch
from orch.errors import OrchError
from orch.master.control.series import Series
from orch.record.metrics_log import read_metrics
from orch.record.store import RunStore
from orch.record.writes import write_json
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.codec import metric_record
from orch.wire.model import Event
from orch.wire.states import RunState

Frames = list[tuple[int, int]]  # (offset, end) of each record of a metrics log
Points = dict[tuple[int, str], dict[int, float]]  # (rank, metric) -> {step: value}
Damage = Callable[[bytes, Frames], bytes]  # what a crash or a bad disk does to a metrics log

RECORDS = 12
STEPS_PER_RECORD = 5
GARBAGE = b"\xde\xad\xbe\xef" * 25  # its "length" is far past MAX_RECORD: never a torn tail


def _record_batches(i: int) -> tuple[int, list[pb.Series]]:
    """Record ``i``: rank i % 2, steps 5k..5k+4 of "loss" and "acc" (k = i // 2)."""
    rank, first = i % 2, (i // 2) * STEPS_PER_RECORD
    steps = list(range(first, first + STEPS_PER_RECORD))
    return rank, [
        pb.Series(name="loss", steps=steps, values=[s / 10 + rank for s in steps]),
        pb.Series(name="acc", steps=steps, values=[-s - rank / 4 for s in steps]),
    ]


def _write_run(run_dir: Path) -> tuple[bytes, Frames]:
    """A finished run of RECORDS records; returns the metrics log and where its records lie."""
    store = RunStore(run_dir)
    store.write_meta({"run_id": "r1", "world_size": 2})
    for i in range(RECORDS):
        rank, series = _record_batches(i)
        append_points(store, rank, 1, series)
    store.append_event(Event(time=1.0, kind="start", rank=-1, message="go"))
    store.close()
    write_json(run_dir / "result.json", {"run_id": "r1", "state": "SUCCEEDED", "world_size": 2})
    data = (run_dir / "metrics.pb").read_bytes()
    frames, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<I", data, pos)
        frames.append((pos, pos + 8 + length))
        pos += 8 + length
    assert len(frames) == RECORDS
    return data, frames


def _expected(lost: set[int]) -> Points:
    """The points of every record but the lost ones."""
    points: Points = {}
    for i in range(RECORDS):
        if i in lost:
            continue
        rank, series = _record_batches(i)
        for s in series:
            points.setdefault((rank, s.name), {}).update(zip(s.steps, s.values, strict=True))
    return points


def _loaded_points(loaded: orch.LoadedRun) -> Points:
    return {
        (rank, name): {int(s): v for s, v in zip(by_rank["step"], by_rank["value"], strict=True)}
        for name, ranks in loaded.history().items()
        for rank, by_rank in ranks.items()
    }


def _flip(at: Callable[[Frames], int]) -> Damage:
    def damage(data: bytes, frames: Frames) -> bytes:
        out = bytearray(data)
        out[at(frames)] ^= 0x5A
        return bytes(out)

    return damage


def _insert(at: Callable[[Frames], int], junk: bytes = GARBAGE) -> Damage:
    def damage(data: bytes, frames: Frames) -> bytes:
        where = at(frames)
        return data[:where] + junk + data[where:]

    return damage


def _frame_size(i: int) -> Callable[[Frames], int]:
    return lambda frames: frames[i][1] - frames[i][0]


# damage, records lost, damaged regions, bytes skipped, torn tail
DAMAGE_CASES: dict[str, tuple[Damage, set[int], int, Callable[[Frames], int], bool]] = {
    "torn tail: the last record cut short": (
        lambda d, f: d[: f[-1][1] - 3],
        {RECORDS - 1},
        0,
        lambda f: 0,
        True,
    ),
    "torn tail: half a header": (lambda d, f: d + d[:5], set(), 0, lambda f: 0, True),
    "flipped byte in the first record's payload": (
        _flip(lambda f: f[0][0] + 20),
        {0},
        1,
        _frame_size(0),
        False,
    ),
    "flipped byte in the first record's length": (
        _flip(lambda f: f[0][0]),
        {0},
        1,
        _frame_size(0),
        False,
    ),
    "flipped byte in the first record's checksum": (
        _flip(lambda f: f[0][0] + 5),
        {0},
        1,
        _frame_size(0),
        False,
    ),
    "flipped byte in a middle record": (
        _flip(lambda f: f[6][0] + 30),
        {6},
        1,
        _frame_size(6),
        False,
    ),
    "flipped byte in the last record": (
        _flip(lambda f: f[-1][1] - 1),
        {RECORDS - 1},
        1,
        _frame_size(RECORDS - 1),
        False,
    ),
    "two damaged records apart": (
        lambda d, f: _flip(lambda f: f[2][0] + 12)(_flip(lambda f: f[9][0] + 12)(d, f), f),
        {2, 9},
        2,
        lambda f: f[2][1] - f[2][0] + f[9][1] - f[9][0],
        False,
    ),
    "garbage prepended": (_insert(lambda f: 0), set(), 1, lambda f: len(GARBAGE), False),
    "garbage inserted between records": (
        _insert(lambda f: f[4][1]),
        set(),
        1,
        lambda f: len(GARBAGE),
        False,
    ),
    "garbage appended": (_insert(lambda f: f[-1][1]), set(), 1, lambda f: len(GARBAGE), False),
    "garbage inside a record": (
        _insert(lambda f: f[3][0] + 11),
        {3},
        1,
        lambda f: f[3][1] - f[3][0] + len(GARBAGE),
        False,
    ),
}


@pytest.mark.parametrize("case", DAMAGE_CASES, ids=list(DAMAGE_CASES))
def test_damaged_metrics_lose_only_the_damaged_records(
    tmp_path: Path, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    damage, lost, regions, skipped, torn = DAMAGE_CASES[case]
    data, frames = _write_run(tmp_path)
    (tmp_path / "metrics.pb").write_bytes(damage(data, frames))

    with caplog.at_level(logging.WARNING):
        loaded = orch.load_run(tmp_path)

    assert _loaded_points(loaded) == _expected(lost)
    kept = sum(len(b) for b in loaded.state().series.values())
    assert kept == 2 * STEPS_PER_RECORD * (RECORDS - len(lost))
    assert loaded.skipped_regions == regions
    assert loaded.skipped_bytes == skipped(frames)
    assert any("incomplete last record" in note for note in loaded.damage) == torn
    assert len(loaded.damage) == regions + torn
    assert all(note.startswith("metrics.pb: ") for note in loaded.damage)
    said = repr(loaded).removeprefix(f"<orch.LoadedRun r1 SUCCEEDED from {tmp_path}")
    assert ("damaged" in said) == bool(regions)
    assert ("incomplete last record" in said) == torn
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(logged) == regions + torn
    assert all(str(tmp_path / "metrics.pb") in m for m in logged)
    assert loaded.state().state is RunState.SUCCEEDED


def test_first_damaged_record_is_reported_where_it_lies(tmp_path: Path) -> None:
    data, frames = _write_run(tmp_path)
    (tmp_path / "metrics.pb").write_bytes(_flip(lambda f: 20)(data, frames))
    loaded = orch.load_run(tmp_path)
    size = frames[0][1]
    assert loaded.damage == [f"metrics.pb: skipped {size} damaged bytes at byte 0"]
    assert loaded.skipped_regions == 1


def test_intact_run_reports_no_damage(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _write_run(tmp_path)
    with caplog.at_level(logging.WARNING):
        loaded = orch.load_run(tmp_path)
    assert _loaded_points(loaded) == _expected(set())
    assert (loaded.damage, loaded.skipped_regions, loaded.skipped_bytes, loaded.stride) == ([], 0, 0, 1)
    assert not caplog.records
    assert repr(loaded) == f"<orch.LoadedRun r1 SUCCEEDED from {tmp_path}>"


@pytest.mark.parametrize("size", [1, 7, 4096, 4 << 20])
def test_pure_garbage_gives_no_points_and_reports_it(tmp_path: Path, size: int) -> None:
    junk = random.Random(size).randbytes(size)
    (tmp_path / "metrics.pb").write_bytes(b"\xff" * 8 + junk)  # a whole header, a length past the limit
    started = time.monotonic()
    loaded = orch.load_run(tmp_path)
    assert time.monotonic() - started < 3.0  # the resynchronising scan runs in C, not per byte
    assert loaded.history() == {}
    assert loaded.skipped_regions == 1
    assert loaded.skipped_bytes == size + 8
    assert loaded.damage


def test_zeros_left_by_a_crash_are_no_damage(tmp_path: Path) -> None:
    """A stretch of zeros reads as empty records (length 0, crc32(b"") == 0): no points lost."""
    data, _ = _write_run(tmp_path)
    (tmp_path / "metrics.pb").write_bytes(data + bytes(4096))
    loaded = orch.load_run(tmp_path)
    assert _loaded_points(loaded) == _expected(set())
    assert loaded.damage == []


def test_empty_and_missing_metrics_logs(tmp_path: Path) -> None:
    _write_run(tmp_path)
    (tmp_path / "metrics.pb").write_bytes(b"")
    assert orch.load_run(tmp_path).history() == {}
    (tmp_path / "metrics.pb").unlink()
    assert orch.load_run(tmp_path).history() == {}
    assert list(read_metrics(tmp_path / "metrics.pb")) == []


def test_read_metrics_alone_logs_what_it_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data, frames = _write_run(tmp_path)
    log = tmp_path / "metrics.pb"
    log.write_bytes(_flip(lambda f: f[1][0] + 9)(data, frames) + data[:3])
    with caplog.at_level(logging.WARNING):
        records = list(read_metrics(log))
    assert len(records) == RECORDS - 1
    assert [r.getMessage() for r in caplog.records] == [
        f"{log}: skipped {frames[1][1] - frames[1][0]} damaged bytes at byte {frames[1][0]}",
        f"{log}: ignored an incomplete last record (3 bytes at byte {len(data)}): "
        "its writer stopped in the middle of it",
    ]


def test_a_record_whose_series_do_not_add_up_is_damage(tmp_path: Path) -> None:
    """A record that parses but has more steps than values is skipped, not half-read."""
    data, _ = _write_run(tmp_path)
    bad = pb.MetricRecord(rank=0, attempt=1, series=[pb.Series(name="loss", steps=[1, 2], values=[1.0])])
    payload = bad.SerializeToString()
    record = struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
    (tmp_path / "metrics.pb").write_bytes(record + data)
    loaded = orch.load_run(tmp_path)
    assert _loaded_points(loaded) == _expected(set())
    assert loaded.skipped_bytes == len(record)


# -- crafted JSON files --------------------------------------------------------------------

DEEP = b"[" * 100_000 + b"]" * 100_000
RESULT = {"run_id": "r", "state": "SUCCEEDED", "world_size": 1}


def _result(**changes: object) -> bytes:
    return json.dumps({**RESULT, **changes}).encode()


BAD_JSON = {
    "result.json: unknown state": ("result.json", _result(state="BOGUS"), "'state'"),
    "result.json: no state": ("result.json", b'{"run_id": "r"}', "'state' is missing"),
    "result.json: ranks not a list": ("result.json", _result(ranks=5), "'ranks'"),
    "result.json: a rank not an object": ("result.json", _result(ranks=[7]), "ranks[0]"),
    "result.json: a rank without its rank": ("result.json", _result(ranks=[{}]), "'rank' is missing"),
    "result.json: a rank with a bad state": (
        "result.json",
        _result(ranks=[{"rank": 0, "state": "ASLEEP"}]),
        "ranks[0]",
    ),
    "result.json: a rank's pid a string": ("result.json", _result(ranks=[{"rank": 0, "pid": "12"}]), "'pid'"),
    "result.json: world_size a string": ("result.json", _result(world_size="4"), "'world_size'"),
    "result.json: elapsed an object": ("result.json", _result(elapsed={}), "'elapsed'"),
    "result.json: not UTF-8": ("result.json", b'{"state": "\xff\xfe"}', "UnicodeDecodeError"),
    "result.json: 100k-deep nesting": ("result.json", DEEP, "RecursionError"),
    "result.json: deep nesting in a field": ("result.json", b'{"ranks": ' + DEEP + b"}", "RecursionError"),
    "result.json: an array": ("result.json", b"[]", "JSON object"),
    "result.json: cut short": ("result.json", b'{"state": "SUCC', "not valid JSON"),
    "result.json: empty": ("result.json", b"", "not valid JSON"),
    "run.json: an array": ("run.json", b"[1, 2]", "JSON object"),
    "run.json: cut short": ("run.json", b"{", "not valid JSON"),
    "run.json: run_id a number": ("run.json", b'{"run_id": 7}', "'run_id'"),
    "run.json: not UTF-8": ("run.json", b"\x80\x81", "UnicodeDecodeError"),
    "run.json: 100k-deep nesting": ("run.json", DEEP, "RecursionError"),
}


@pytest.mark.parametrize("case", BAD_JSON, ids=list(BAD_JSON))
def test_crafted_json_files_raise_orch_error_naming_the_file(tmp_path: Path, case: str) -> None:
    name, content, what = BAD_JSON[case]
    _write_run(tmp_path)
    (tmp_path / name).write_bytes(content)
    with pytest.raises(OrchError) as caught:
        orch.load_run(tmp_path)
    message = str(caught.value)
    assert str(tmp_path / name) in message
    assert what in message
    if "not valid JSON" in message:
        assert isinstance(caught.value.__cause__, ValueError | RecursionError)


def test_a_missing_result_means_the_run_did_not_finish(tmp_path: Path) -> None:
    _write_run(tmp_path)
    (tmp_path / "result.json").unlink()
    loaded = orch.load_run(tmp_path)
    assert loaded.state().state is RunState.FAILED
    assert "did not finish" in loaded.state().failure
    assert loaded.run_id == "r1"  # from run.json
    assert _loaded_points(loaded) == _expected(set())


def test_a_full_result_reads_back(tmp_path: Path) -> None:
    _write_run(tmp_path)
    rank = {"rank": 1, "state": "FAILED", "loss": "nan", "has_loss": True, "exit_code": 3, "step": 9}
    write_json(tmp_path / "result.json", {**RESULT, "state": "FAILED", "ranks": [rank]})
    (v,) = orch.load_run(tmp_path).state().ranks
    assert (v.rank, v.state.value, v.exit_code, v.step, v.diverged) == (1, "FAILED", 3, 9, True)


EVENT = {"time": 1.5, "kind": "start", "rank": 0, "message": "go"}


def _line(value: object) -> bytes:
    return json.dumps(value).encode() + b"\n"


BAD_EVENTS = {
    "a bad line in the middle": (_line(EVENT) + b"{oops\n" + _line(EVENT), "line 2"),
    "a line that is a list": (_line(EVENT) + _line([1, 2]), "line 2"),
    "a last line that is a list": (_line(EVENT) + b"[1, 2]", "line 2"),
    "an empty line in the middle": (_line(EVENT) + b"\n" + _line(EVENT), "line 2"),
    "an event without its kind": (_line({k: v for k, v in EVENT.items() if k != "kind"}), "'kind'"),
    "an event with a string rank": (_line({**EVENT, "rank": "0"}), "'rank'"),
    "an event with a boolean rank": (_line({**EVENT, "rank": True}), "'rank'"),
    "an event with a null time": (_line({**EVENT, "time": None}), "'time'"),
    "not UTF-8 in the middle": (b'{"kind": "\xff"}\n' + _line(EVENT), "line 1"),
    "deep nesting in the middle": (DEEP + b"\n" + _line(EVENT), "line 1"),
}


@pytest.mark.parametrize("case", BAD_EVENTS, ids=list(BAD_EVENTS))
def test_bad_event_lines_raise_orch_error_naming_file_and_line(tmp_path: Path, case: str) -> None:
    content, where = BAD_EVENTS[case]
    _write_run(tmp_path)
    (tmp_path / "events.jsonl").write_bytes(content)
    with pytest.raises(OrchError) as caught:
        orch.load_run(tmp_path)
    assert str(tmp_path / "events.jsonl") in str(caught.value)
    assert where in str(caught.value)


@pytest.mark.parametrize(
    "torn",
    [b'{"time": 2.0, "ki', b'{"time": 2.0, "kind": "\xe2\x82', b"{", b"\x00\x00\x00"],
    ids=["mid-key", "mid-character", "one brace", "zeros"],
)
def test_a_torn_last_event_line_is_ignored(tmp_path: Path, torn: bytes) -> None:
    _write_run(tmp_path)
    (tmp_path / "events.jsonl").write_bytes(_line(EVENT) + _line({**EVENT, "kind": "end"}) + torn)
    loaded = orch.load_run(tmp_path)
    assert [e["kind"] for e in loaded.events] == ["start", "end"]
    assert [kind for _, kind, _, _ in loaded.state().events] == ["start", "end"]


# -- the points budget ---------------------------------------------------------------------


def _write_points(run_dir: Path, series: dict[tuple[int, str], int], per_record: int) -> None:
    """Series (rank, name) -> how many points, steps 0.., value = step / 2, in chunks."""
    store = RunStore(run_dir)
    store.write_meta({"run_id": "big", "world_size": 1 + max(rank for rank, _ in series)})
    for first in range(0, max(series.values()), per_record):
        for (rank, name), n in series.items():
            steps = range(first, min(first + per_record, n))
            if steps:
                values = [s / 2 for s in steps]
                append_points(store, rank, 1, [pb.Series(name=name, steps=steps, values=values)])
    store.close()


def _csv_rows(path: Path) -> list[tuple[int, str, int, float]]:
    with path.open(newline="") as f:
        reader = csv.reader(f)
        assert next(reader) == ["rank", "metric", "step", "value"]
        return [(int(r), m, int(s), float(v)) for r, m, s, v in reader]


def test_an_oversized_run_is_down_sampled_within_the_budget(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    n = 400_000
    series = {(0, "loss"): n, (0, "acc"): n, (1, "loss"): n}
    _write_points(tmp_path, series, per_record=10_000)

    with caplog.at_level(logging.WARNING):
        loaded = orch.load_run(tmp_path, max_points=100_000)

    held = loaded.state().series
    assert sum(len(b) for b in held.values()) <= 100_000
    assert loaded.stride > 1 and loaded.stride & (loaded.stride - 1) == 0  # a power of two
    assert loaded.points_read == 3 * n
    for key in series:
        steps = held[key].steps.tolist()
        assert steps == list(range(0, n, loaded.stride))  # even: first step 0, last within a stride
        assert held[key].values.tolist() == [s / 2 for s in steps]
    assert f"1 point in {loaded.stride}" in repr(loaded)
    assert any("max_points=100000" in r.getMessage() for r in caplog.records)

    every_point = (  # in the order they were logged
        (str(rank), name, str(step), repr(step / 2))
        for first in range(0, n, 10_000)
        for rank, name in series
        for step in range(first, first + 10_000)
    )
    with loaded.to_csv(tmp_path / "all.csv").open(newline="") as f:
        rows = csv.reader(f)
        assert next(rows) == ["rank", "metric", "step", "value"]
        assert all(tuple(row) == want for row, want in zip(rows, every_point, strict=True))


@pytest.mark.parametrize(
    ("max_points", "stride"),
    [(None, 1), (3 * 1000, 1), (2999, 2), (1500, 2), (1499, 4), (3, 1024)],
)
def test_the_stride_is_the_least_power_of_two_that_fits(
    tmp_path: Path, max_points: int | None, stride: int
) -> None:
    _write_points(tmp_path, {(0, "a"): 1000, (0, "b"): 1000, (1, "a"): 1000}, per_record=100)
    loaded = orch.load_run(tmp_path, max_points=max_points)
    assert loaded.stride == stride
    assert sum(len(b) for b in loaded.state().series.values()) == 3 * len(range(0, 1000, stride))
    assert ("down-sampled" in repr(loaded)) == (stride > 1)


def test_every_series_keeps_its_first_point_below_one_per_series(tmp_path: Path) -> None:
    _write_points(tmp_path, {(r, "loss"): 50 for r in range(4)}, per_record=10)
    loaded = orch.load_run(tmp_path, max_points=2)
    assert {key: buf.steps.tolist() for key, buf in loaded.state().series.items()} == {
        (r, "loss"): [0] for r in range(4)
    }


@pytest.mark.parametrize("bad", [0, -1, 2.5, "10", True])
def test_a_bad_budget_is_a_config_error(tmp_path: Path, bad: object) -> None:
    _write_run(tmp_path)
    with pytest.raises(orch.ConfigError, match="max_points"):
        orch.load_run(tmp_path, max_points=bad)  # type: ignore[arg-type]


# Batches (attempt, first step, last step) of one series, as a restarted group logs them.
RESTARTS = {
    "attempt 2 replays from step 5": [(1, 0, 9), (2, 5, 14)],
    "attempt 2 replays from step 0": [(1, 0, 9), (2, 0, 6)],
    "attempt 2 goes on where 1 stopped": [(1, 0, 9), (2, 10, 19)],
    "three attempts, each further back": [(1, 0, 30), (1, 31, 40), (2, 20, 35), (3, 10, 50)],
    "attempt 3 replays only attempt 2's points": [(1, 0, 20), (2, 15, 30), (3, 25, 40)],
    "many small batches": [(1, s, s + 1) for s in range(0, 60, 2)] + [(2, s, s) for s in range(30, 90)],
}


def _write_restarts(run_dir: Path, batches: list[tuple[int, int, int]]) -> Series:
    """Write the batches for two series of two ranks; returns the master's view of one."""
    store = RunStore(run_dir)
    oracle = Series()
    for attempt, first, last in batches:
        steps = list(range(first, last + 1))
        values = [attempt * 1000.0 + s for s in steps]
        oracle.add(steps, values, [0.0] * len(steps), attempt)
        for rank in (0, 1):
            append_points(
                store,
                rank,
                attempt,
                [pb.Series(name=name, steps=steps, values=values) for name in ("loss", "acc")],
            )
    store.close()
    return oracle


@pytest.mark.parametrize("case", RESTARTS, ids=list(RESTARTS))
def test_restarted_steps_count_once_as_the_master_counts_them(tmp_path: Path, case: str) -> None:
    oracle = _write_restarts(tmp_path, RESTARTS[case])
    expected = list(zip(oracle.steps, oracle.values, strict=True))
    assert len({s for s, _ in expected}) == len(expected)  # the oracle itself counts each step once

    loaded = orch.load_run(tmp_path, max_points=None)
    for buf in loaded.state().series.values():
        assert list(zip(buf.steps.tolist(), buf.values.tolist(), strict=True)) == expected

    rows = _csv_rows(loaded.to_csv(tmp_path / "points.csv"))
    assert len(rows) == 4 * len(expected)
    for key in loaded.state().series:
        assert sorted((s, v) for r, m, s, v in rows if (r, m) == key) == expected

    thin = orch.load_run(tmp_path, max_points=4 * len(expected) // 3)
    assert thin.stride > 1
    for buf in thin.state().series.values():
        kept = list(zip(buf.steps.tolist(), buf.values.tolist(), strict=True))
        assert kept and set(kept) <= set(expected)
        assert kept == sorted(kept)
        assert len(kept) <= len(expected) // 2 + 2


def test_memory_stays_near_the_budget_whatever_the_log_size(tmp_path: Path) -> None:
    n = 1_000_000  # per series; 4 series: 4M points, 64 MB as bare int64 + float64 arrays
    _write_points(tmp_path, {(r, name): n for r in (0, 1) for name in ("loss", "acc")}, per_record=20_000)
    everything = 4 * n * 16
    tracemalloc.start()
    try:
        loaded = orch.load_run(tmp_path)  # the default budget: 1M points
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < everything / 2, f"peak {peak / 1e6:.0f} MB, holding everything {everything / 1e6:.0f} MB"
    assert loaded.stride == 4
    assert sum(len(b) for b in loaded.state().series.values()) <= 1_000_000


def append_points(store: RunStore, rank: int, attempt: int, series: list[pb.Series]) -> None:
    """A beat's points into the store's metrics log, as the master appends them."""
    store.append_metrics(metric_record(rank, attempt, series))
