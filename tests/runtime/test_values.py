"""What the ranks' training functions return comes back to the process that waits: real
2-rank DDP runs on gloo, their values read from the run dir by result.value / result.values,
for a run launched here, one detached by a process that then exited, one loaded from disk,
and a sweep's trials."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import orch
from conftest import TESTS
from orch.record.values import Returned, ValueNotReturned
from orch.runtime.values import _Capped, keep_value, on_cpu, tensor_bytes

pytestmark = pytest.mark.timeout(240)


def _launch(tmp_path: Path, kind: str, **options: Any) -> orch.RunResult:
    config = {"kind": kind, **options.pop("config", {})}
    with orch.launch(
        "jobs:returns_a_value", world_size=2, config=config, run_root=str(tmp_path), **options
    ) as run:
        return run.wait(timeout=120)


def test_a_state_dict_comes_back_and_loads_into_a_model(tmp_path: Path) -> None:
    result = _launch(tmp_path, "state_dict")
    assert result.state is orch.RunState.SUCCEEDED
    sd = result.value
    assert set(sd) == {"weight", "bias"} and all(t.device.type == "cpu" for t in sd.values())
    model = torch.nn.Linear(4, 2)
    model.load_state_dict(sd)  # the kernel uses it as it is
    # DDP kept the ranks' parameters equal: every rank returned the same state_dict
    other = result.values[1]
    assert all(torch.equal(sd[k], other[k]) for k in sd)
    # trained, not the initial weights
    torch.manual_seed(0)
    assert not torch.equal(torch.nn.Linear(4, 2).weight, sd["weight"])


def test_a_tensor_and_a_dict_of_floats_come_back_from_every_rank_in_rank_order(tmp_path: Path) -> None:
    tensors = _launch(tmp_path, "tensor").values
    assert [t.tolist() for t in tensors] == [[0.0] * 3, [1.0] * 3]
    floats = _launch(tmp_path, "floats")
    assert [v["rank"] for v in floats.values] == [0.0, 1.0]
    assert floats.value["loss"] == pytest.approx(floats.final_loss[0], abs=1e-5)


def test_a_model_comes_back_as_a_model_unwrapped_from_ddp_and_of_a_class_the_kernel_never_saw(
    tmp_path: Path,
) -> None:
    ddp = _launch(tmp_path, "ddp")
    assert type(ddp.value) is torch.nn.Linear  # the module DDP wrapped, usable here
    assert ddp.value(torch.ones(1, 4)).shape == (1, 2)
    own = _launch(tmp_path, "own_class").values
    assert [type(m).__name__ for m in own] == ["Head", "Head"]
    assert [m(torch.tensor([1.0])).item() for m in own] == [2.0, 3.0]


def test_nothing_returned_is_none(tmp_path: Path) -> None:
    result = _launch(tmp_path, "none")
    assert result.value is None and result.values == [None, None]
    assert not (result.run_dir / "values").exists()  # type: ignore[operator]


def test_a_value_that_does_not_pickle_is_named_with_its_rank_and_type(tmp_path: Path) -> None:
    result = _launch(tmp_path, "lock")
    assert result.state is orch.RunState.SUCCEEDED  # the training's outcome stays its own
    assert result.value == "fine"
    with pytest.raises(
        ValueNotReturned, match=r"rank 1's value \(_thread.lock\) cannot be sent back.*pickle"
    ):
        _ = result.values
    log = (result.run_dir / "logs").glob("*1.log")  # type: ignore[operator]
    assert any("rank 1's value" in p.read_text() for p in log)


def test_a_value_over_the_cap_is_refused_naming_its_size_and_the_cap_and_never_written(
    tmp_path: Path,
) -> None:
    # 1 MB of tensor against a 100 kB cap: refused from its tensors' size, before any write
    result = _launch(tmp_path, "big", value_cap=100_000, config={"numel": 250_000})
    refused = (
        r"rank 0's value \(torch.Tensor\) is 1 MB \(1,000,000 bytes\), "
        r"more than the cap of 100 kB \(100,000 bytes\).*value_cap"
    )
    with pytest.raises(ValueNotReturned, match=refused):
        _ = result.value
    names = sorted(os.listdir(result.run_dir / "values"))  # type: ignore[operator]
    assert names == ["rank-0.a1.error", "rank-1.a1.error"], names  # no value file, no temporary left


def test_the_cap_is_a_checked_launch_option(tmp_path: Path) -> None:
    with pytest.raises(orch.ConfigError, match="value_cap must be an integer >= 1"):
        orch.launch("jobs:returns_a_value", world_size=2, value_cap=0, run_root=str(tmp_path))


DETACHING_KERNEL = """
import sys
sys.path.insert(0, {tests!r})
import orch
run = orch.launch("jobs:returns_a_value", world_size=2, config={{"kind": "floats", "steps": 20}},
                  run_root={root!r}, detach=True)
print(run.run_id, flush=True)
run.disconnect()
"""


def test_a_detached_runs_value_comes_back_after_the_process_that_launched_it_is_gone(tmp_path: Path) -> None:
    kernel = subprocess.run(
        [sys.executable, "-c", DETACHING_KERNEL.format(tests=str(TESTS), root=str(tmp_path))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert kernel.returncode == 0, kernel.stderr[-3000:]
    run_id = kernel.stdout.split()[-1]
    attached = orch.attach(run_id, run_root=str(tmp_path))
    try:
        value = attached.wait(timeout=120).value
    finally:
        attached.close()
    assert value["rank"] == 0.0
    loaded = orch.load_run(tmp_path / run_id)
    assert loaded.wait().values[1]["rank"] == 1.0


def test_a_sweeps_trials_give_their_values(tmp_path: Path) -> None:
    sweep = orch.sweep(
        "jobs:returns_a_value",
        [{"kind": "floats", "steps": 3}, {"kind": "tensor", "steps": 3}],
        world_size=2,
        run_root=str(tmp_path),
        name="values",
    )
    with sweep:
        sweep.wait(timeout=180)
        first, second = sweep.trials
        assert first.value["rank"] == 0.0 and [v["rank"] for v in first.values] == [0.0, 1.0]
        assert second.values[1].tolist() == [1.0] * 3


@pytest.mark.unit
def test_values_go_to_the_cpu_and_their_tensors_are_counted_once() -> None:
    shared = torch.ones(10)
    value = {"a": shared, "b": [shared, torch.zeros(5, dtype=torch.float64)], "c": (1, "x")}
    assert tensor_bytes(value) == 10 * 4 + 5 * 8
    moved = on_cpu(value)
    assert moved["c"] == (1, "x") and moved["b"][1].dtype == torch.float64
    assert tensor_bytes(torch.nn.Linear(3, 2)) == (6 + 2) * 4


@pytest.mark.unit
def test_the_capped_file_stops_writing_at_the_cap(tmp_path: Path) -> None:
    with open(tmp_path / "f", "wb") as f:
        capped = _Capped(f, 10)
        capped.write(b"12345")
        with pytest.raises(Exception):  # noqa: B017 - _OverCap, private
            capped.write(b"123456")
    assert capped.over and (tmp_path / "f").read_bytes() == b"12345"


@pytest.mark.unit
def test_a_value_whose_pickle_passes_the_cap_stops_being_written_there(tmp_path: Path) -> None:
    """No tensor to count: the write itself stops at the cap, and leaves no file behind."""
    why = keep_value(tmp_path / "run", 0, 1, list(range(100_000)), cap=10_000)
    assert why is not None and why.startswith(
        "rank 0's value (builtins.list) takes more than the cap of 10 kB"
    )
    assert os.listdir(tmp_path / "run" / "values") == ["rank-0.a1.error"]
    assert keep_value(tmp_path / "run", 1, 1, list(range(10)), cap=10_000) is None
    assert Returned(tmp_path / "run", 2, 1).of(1) == list(range(10))
