"""The pieces of torchrun's contract alone: its environment, the stand-in for
init_process_group / destroy_process_group (on a real gloo group of one), script targets, the
command line that passes a script its arguments, and the log's lines as a terminal shows them."""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from orch.cli import build_parser
from orch.errors import ConfigError
from orch.record.store import shown_lines, tail
from orch.runtime._torchrun import _REAL, GroupAdopter, backends, environment
from orch.runtime.script import Script, config_args, script_target
from orch.views.output import OutputFollower, parse_ranks


def test_the_environment_numbers_ranks_host_by_host() -> None:
    env = environment(
        rank=5, local_rank=1, world_size=8, local_world_size=4, run_id="r1", attempt=2,
        master_addr="[::1]", master_port=29501,
    )  # fmt: skip
    assert env["RANK"] == "5" and env["LOCAL_RANK"] == "1" and env["GROUP_RANK"] == "1"
    assert env["GROUP_WORLD_SIZE"] == "2" and env["LOCAL_WORLD_SIZE"] == "4" and env["WORLD_SIZE"] == "8"
    assert env["MASTER_ADDR"] == "::1" and env["MASTER_PORT"] == "29501"
    assert env["TORCHELASTIC_RUN_ID"] == "r1" and env["TORCHELASTIC_RESTART_COUNT"] == "1"


def test_backend_strings_name_their_backends() -> None:
    assert backends("cpu:gloo,cuda:nccl") == {"gloo", "nccl"}
    assert backends("GLOO") == {"gloo"}


@pytest.fixture
def adopted(tmp_path: Path) -> Iterator[GroupAdopter]:
    """A rank of one with the stand-ins installed; its group made at the first init call."""
    store = dist.FileStore(str(tmp_path / "store"), 1)

    def make(backend: str | None, timeout: datetime.timedelta | None, device_id: object) -> None:
        from orch.runtime._torchrun import real_init_process_group

        real_init_process_group(backend or "gloo", store=store, rank=0, world_size=1, timeout=timeout)

    adopter = GroupAdopter(rank=0, world_size=1, make=make).install()
    yield adopter
    adopter.destroy_all()
    for module in (dist, dist.distributed_c10d):  # torch's own again, for the tests after this one
        module.init_process_group, module.destroy_process_group = _REAL["init"], _REAL["destroy"]


def test_init_joins_and_destroy_lets_go(adopted: GroupAdopter) -> None:
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=30))
    assert dist.is_initialized() and dist.get_world_size() == 1
    dist.destroy_process_group()  # let go of, not torn down: a second init joins it again
    assert dist.is_initialized()
    dist.init_process_group(backend="gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 1.0
    assert (adopted.joined, adopted.released) == (2, 1)
    own = dist.new_group([0])
    dist.destroy_process_group(own)  # a group the code made is destroyed as asked
    assert dist.is_initialized()


def test_init_asking_for_another_world_rank_or_backend_is_refused(adopted: GroupAdopter) -> None:
    dist.init_process_group("gloo")
    with pytest.raises(ValueError, match=r"world_size=2\) in rank 0 of an orch run of 1 rank"):
        dist.init_process_group("gloo", world_size=2)
    with pytest.raises(ValueError, match=r"rank=3"):
        dist.init_process_group("gloo", rank=3)
    with pytest.raises(RuntimeError, match=r"backend='nccl'.*process group is 'gloo'"):
        dist.init_process_group("nccl")


def test_a_script_target_is_found_and_checked(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    target = script_target("train.py", args=["--epochs", "2"], module=None, workdir=str(tmp_path))
    assert target == Script(path=str(tmp_path / "train.py"), args=("--epochs", "2"))
    assert target.describe() == "train.py --epochs 2" and target.stem == "train"
    with pytest.raises(ConfigError, match="there is no script"):
        script_target("nope.py", args=None, module=None, workdir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"there is no module 'nopkg\.train'"):
        script_target(None, args=None, module="nopkg.train", workdir=str(tmp_path))
    with pytest.raises(
        ConfigError, match="args= are a script's command-line arguments or a function's values"
    ):
        script_target("jobs:allreduce_steps", args=["-x"], module=None, workdir=str(tmp_path))
    with pytest.raises(ConfigError, match="args must be a list"):
        script_target("train.py", args="--epochs 2", module=None, workdir=str(tmp_path))  # type: ignore[arg-type]
    assert script_target("train.py:main", args=None, module=None, workdir=str(tmp_path)) == "train.py:main"


def test_a_config_reaches_a_script_as_arguments() -> None:
    assert config_args({"lr": 0.1, "name": "a b", "deep": True, "sizes": [2, 3]}) == [
        "--lr=0.1", "--name=a b", "--deep=true", "--sizes=[2, 3]",
    ]  # fmt: skip


def test_what_follows_the_script_is_the_scripts_even_where_orch_has_the_flag() -> None:
    args = build_parser().parse_args(
        ["run", "--workers", "2", "train.py", "--workers", "7", "--ma", "1", "--steps", "3", "-m", "x"]
    )
    assert args.world_size == 2 and args.script == "train.py" and not args.as_module
    assert args.script_args == ["--workers", "7", "--ma", "1", "--steps", "3", "-m", "x"]
    args = build_parser().parse_args(["run", "-m", "pkg.train", "--lr", "1"])
    assert args.as_module and args.script == "pkg.train" and args.script_args == ["--lr", "1"]


def test_a_log_shows_a_rewritten_line_in_its_last_state(tmp_path: Path) -> None:
    bar = "".join(f"\r{p:3d}%|{'#' * (p // 10)}" for p in range(0, 101, 5))
    assert shown_lines(f"start\n{bar}\nprinted after\r\n") == ["start", "100%|##########", "printed after"]
    log = tmp_path / "w0.log"
    log.write_text("mine\n" + bar * 40 + "\nlast\n")
    assert tail(log, 3).splitlines() == ["mine", "100%|##########", "last"]


def test_the_output_follower_prints_complete_lines_of_the_shown_ranks(tmp_path: Path) -> None:
    for wid in ("r-w0", "r-w1"):
        (tmp_path / f"{wid}.log").write_text(
            f"2026-12-02 10:00:00,000 {wid} INFO worker {wid} registered\nhello from {wid}\n\r50%\r100%"
        )
        os.chmod(tmp_path / f"{wid}.log", 0o600)
    ranks = [(0, "r-w0"), (1, "r-w1")]
    rank0 = OutputFollower(tmp_path, lambda: ranks, parse_ranks("0"))
    assert rank0.lines() == ["hello from r-w0"]  # orch's own INFO line stays in the log
    assert rank0.lines() == []  # the bar has not ended its line yet
    with open(tmp_path / "r-w0.log", "a") as f:
        f.write("\ndone\n")
    assert rank0.lines() == ["100%", "done"]
    every = OutputFollower(tmp_path, lambda: ranks, parse_ranks("all"))
    shown = ["[rank0]: hello from r-w0", "[rank0]: 100%", "[rank0]: done", "[rank1]: hello from r-w1"]
    assert every.lines() == shown
    assert OutputFollower(tmp_path, lambda: ranks, parse_ranks("none")).lines() == []
