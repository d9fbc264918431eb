"""``orch run``'s cluster flags: each cluster kind's own (``--slurm ...``, ``--ray ADDRESS ...``),
the shared ones (``--nodes``, ``--master-addr``), and what the command refuses, read from the
real parser into the real options classes, with nothing started."""

from __future__ import annotations

import subprocess
import sys

import pytest

import orch
from orch.cli import build_parser, cluster_from_flags
from orch.launchers.clusters import kind_of, kinds


def cluster(*flags: str) -> object:
    return cluster_from_flags(build_parser().parse_args(["run", *flags, "--fn", "jobs:allreduce_steps"]))


def refused(*flags: str) -> str:
    with pytest.raises(orch.ConfigError) as e:
        cluster(*flags)
    return str(e.value)


def test_ray_flags_build_the_ray_options() -> None:
    built = cluster(
        "--ray", "10.0.0.5:6379", "--nodes", "2", "--ranks-per-node", "4", "--cpus-per-rank", "0.5",
        "--gpus-per-rank", "1", "--ray-resource", "accel=1", "--ray-resource", "mem=2.5",
        "--master-addr", "10.0.0.9",
    )  # fmt: skip
    assert built == orch.Ray(
        address="10.0.0.5:6379", nodes=2, ranks_per_node=4, cpus_per_rank=0.5, gpus_per_rank=1.0,
        resources={"accel": 1.0, "mem": 2.5}, master_addr="10.0.0.9",
    )  # fmt: skip
    assert cluster("--ray", "auto") == orch.Ray()  # what is not given is Ray's default


def test_slurm_flags_build_the_slurm_options() -> None:
    built = cluster(
        "--slurm", "--nodes", "2", "--tasks-per-node", "4", "--partition", "gpu", "--time", "2:00:00",
        "--gpus-per-node", "4", "--sbatch-arg=--qos=high", "--master-addr", "10.0.0.9",
    )  # fmt: skip
    assert built == orch.Slurm(
        nodes=2, tasks_per_node=4, partition="gpu", time="2:00:00", gpus_per_node=4,
        sbatch_args=("--qos=high",), master_addr="10.0.0.9",
    )  # fmt: skip
    assert cluster("--slurm") == orch.Slurm()


def test_without_a_selector_the_run_is_on_this_machine() -> None:
    assert cluster() is None


def test_every_kind_with_flags_builds_options_of_its_own_kind() -> None:
    flagged = {k.name: k for k in kinds() if k.cli is not None}
    assert {"slurm", "ray"} <= set(flagged)
    assert kind_of(cluster("--slurm")) is flagged["slurm"]
    assert kind_of(cluster("--ray", "auto")) is flagged["ray"]


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--ranks-per-node", "2"], "--ranks-per-node only apply to a Ray run: add --ray ADDRESS"),
        (["--gpus-per-rank", "0"], "--gpus-per-rank only apply to a Ray run: add --ray ADDRESS"),
        (["--ray-resource", "a=1", "--cpus-per-rank", "2"], "--cpus-per-rank, --ray-resource only apply"),
        (["--tasks-per-node", "2"], "--tasks-per-node only apply to a Slurm run: add --slurm"),
        (["--slurm", "--ranks-per-node", "2"], "--ranks-per-node only apply to a Ray run: add --ray"),
        (["--ray", "auto", "--partition", "gpu"], "--partition only apply to a Slurm run: add --slurm"),
        (["--nodes", "2"], "--nodes only apply to a run on a cluster: add --slurm or --ray"),
        (
            ["--master-addr", "10.0.0.9"],
            "--master-addr only apply to a run on a cluster: add --slurm or --ray",
        ),
    ],
)
def test_a_kinds_flags_without_its_selector_are_refused_naming_it(flags: list[str], said: str) -> None:
    assert said in refused(*flags)


def test_two_selectors_at_once_are_refused_naming_both() -> None:
    said = refused("--slurm", "--ray", "127.0.0.1:6379")
    assert said.startswith("--slurm and --ray: a run goes to one cluster"), said


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--ray", "127.0.0.1:6379", "--nodes", "2", "--ranks-per-node", "2"],
         "--workers 3 but --nodes x --ranks-per-node is 4: leave out --workers with --ray"),
        (["--slurm", "--nodes", "2"],
         "--workers 3 but --nodes x --tasks-per-node is 2: leave out --workers with --slurm"),
    ],
)  # fmt: skip
def test_workers_other_than_the_cluster_s_world_size_are_refused(flags: list[str], said: str) -> None:
    assert said in refused("--workers", "3", *flags)
    assert cluster("--workers", "4" if "--ray" in flags else "2", *flags) is not None  # the same: fine


@pytest.mark.parametrize("flags, kind", [(["--ray", "auto"], "Ray"), (["--slurm"], "Slurm")])
def test_detach_with_a_cluster_is_refused_naming_the_kind(flags: list[str], kind: str) -> None:
    said = refused("--detach", *flags)
    assert (
        said == f"--detach with {flags[0]}: a {kind} run's master lives in this command; leave out --detach"
    )


@pytest.mark.parametrize(
    "flags, options",
    [
        (["--ray", "nowhere"], {"address": "nowhere"}),
        (["--ray", "auto", "--ranks-per-node", "0"], {"ranks_per_node": 0}),
        (["--ray", "auto", "--cpus-per-rank", "-1"], {"cpus_per_rank": -1.0}),
        (["--ray", "auto", "--ray-resource", "accel=-1"], {"resources": {"accel": -1.0}}),
    ],
)
def test_a_bad_ray_value_is_refused_as_orch_ray_refuses_it(flags: list[str], options: dict) -> None:
    with pytest.raises(orch.ConfigError) as direct:
        orch.Ray(**options)
    assert refused(*flags) == str(direct.value)


def test_a_ray_resource_that_is_not_name_equals_amount_is_refused() -> None:
    for pair in ("accel", "=1", "accel=lots"):
        assert refused("--ray", "auto", "--ray-resource", pair).startswith(
            f"--ray-resource {pair}: write NAME=AMOUNT"
        )


def test_the_command_and_its_ray_flags_import_no_ray() -> None:
    code = (
        "import sys\n"
        "from orch.cli import build_parser, cluster_from_flags\n"
        "args = build_parser().parse_args(['run', '--ray', '127.0.0.1:6379', '--nodes', '2', 'train.py'])\n"
        "assert cluster_from_flags(args).world_size == 2\n"
        "try:\n"
        "    build_parser().parse_args(['run', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code + "print('ray' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "--ray ADDRESS" in done.stdout, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"
