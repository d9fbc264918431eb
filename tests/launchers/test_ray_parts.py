"""orch.Ray's options and this machine's checks, without a cluster."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest

import orch
from conftest import orch_cli
from orch.launchers.ray.options import ray_master_host


@pytest.mark.parametrize(
    "kwargs, said",
    [
        ({"nodes": 0}, "Ray(nodes=...) must be an integer >= 1"),
        ({"ranks_per_node": 1.5}, "Ray(ranks_per_node=...) must be an integer >= 1"),
        ({"cpus_per_rank": -1}, "Ray(cpus_per_rank=...) must be a number >= 0"),
        ({"resources": {"TPU": "4"}}, "Ray(resources=...) must map resource names to numbers"),
        ({"address": "nowhere"}, "nowhere"),
    ],
)
def test_a_wrong_option_is_told_where_it_was_written(kwargs: dict, said: str) -> None:
    with pytest.raises(orch.ConfigError) as wrong:
        orch.Ray(**kwargs)
    assert said in str(wrong.value), wrong.value


def test_a_bundle_holds_each_rank_s_share_of_a_node() -> None:
    ray = orch.Ray(nodes=2, ranks_per_node=4, cpus_per_rank=2, gpus_per_rank=1, resources={"accel": 0.5})
    assert ray.world_size == 8
    assert ray.bundle() == {"CPU": 8, "GPU": 4, "accel": 2.0}
    assert ray.describe() == "2 Ray node(s) of 4 ranks (8 CPU, 4 GPU, 2 accel each)"


def test_the_master_listens_on_loopback_for_a_cluster_on_this_machine() -> None:
    assert ray_master_host(orch.Ray(address="127.0.0.1:6379")) == "127.0.0.1"
    assert ray_master_host(orch.Ray(address="auto")) == "127.0.0.1"
    assert ray_master_host(orch.Ray(address="10.1.2.3:6379", master_addr="10.1.2.9")) == "10.1.2.9"


def test_a_world_size_that_is_not_the_cluster_s_is_refused(tmp_path: Path) -> None:
    with pytest.raises(orch.ConfigError) as wrong:
        orch.launch(
            "jobs:allreduce_steps",
            world_size=3,
            cluster=orch.Ray(nodes=2, ranks_per_node=2),
            run_root=str(tmp_path),
        )
    assert "world_size=3 but the cluster runs 2 Ray node(s) of 2 ranks" in str(wrong.value), wrong.value


def test_without_ray_installed_the_launch_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    with pytest.raises(orch.ConfigError) as missing:
        orch.launch("jobs:allreduce_steps", world_size=2, cluster=orch.Ray(nodes=2), run_root=str(tmp_path))
    assert 'pip install "orch[ray]"' in str(missing.value), missing.value


def test_import_orch_and_its_cluster_kinds_never_import_ray() -> None:
    import subprocess
    import sys

    code = (
        "import sys, orch\n"
        "from orch.launchers.clusters import kind_of\n"
        "kind_of(orch.Ray(nodes=2)).check(orch.Ray(nodes=2))\n"
        "print('ray' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


def test_an_address_where_no_ray_cluster_answers_fails_the_launch_naming_it(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """ray.init would retry a wrong address for minutes, logging; the launch fails at once
    instead (the subprocess's 60 s bound is far below Ray's retries)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens on it once closed
    proc = orch_cli(
        "run", "--ray", f"127.0.0.1:{port}", "--nodes", "2", "--run-root", str(tmp_path),
        env=subprocess_env, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"no Ray cluster answers at 127.0.0.1:{port} (Ray(address=...))" in proc.stderr, proc.stderr
    assert "ray start --head" in proc.stderr
