"""The pieces of a Slurm run that need no cluster: the signed function file, the job script,
the arguments, and what sbatch's refusals become. (Against a real Slurm: tests/launchers/test_slurm.py.)"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import orch
from conftest import ORCH
from orch.launchers.slurm import gang as slurm_gang
from orch.launchers.slurm.job import _explain, job_script
from orch.launchers.slurm.options import Slurm
from orch.runtime.function_file import FUNCTION_FILE, read_function, write_function
from orch.wire.channel import admit


def train(ctx: object) -> int:
    return 7


def test_the_function_file_is_private_and_loads_with_the_runs_token(tmp_path: Path) -> None:
    path = write_function(tmp_path, train, {"cell": "source"}, "secret-token")
    assert path == tmp_path / FUNCTION_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    fn, sources = read_function(path, "secret-token")
    assert fn(None) == 7 and sources == {"cell": "source"}


class _Marks:
    """Unpickling this writes a file: proof that a refused file was never unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (Path.write_text, (Path(self.path), "unpickled"))  # type: ignore[return-value]


@pytest.mark.parametrize("how", ["another token", "changed after the launch", "no token"])
def test_a_file_that_does_not_match_the_token_is_refused_before_unpickling(tmp_path: Path, how: str) -> None:
    marker = tmp_path / "marker"
    path = write_function(tmp_path, train, {}, "secret-token")
    if how == "changed after the launch":
        data = path.read_bytes()
        head = data.index(b"\n") + 1 + 32
        path.write_bytes(data[:head] + pickle.dumps({"fn": _Marks(str(marker)), "sources": {}}))
    token = {"another token": "other-token", "changed after the launch": "secret-token", "no token": None}[
        how
    ]
    with pytest.raises(orch.WorkerError) as e:
        read_function(path, token)
    said = str(e.value)
    assert str(path) in said
    assert ("ORCH_TOKEN" in said) if how == "no token" else ("does not carry the signature of run" in said)
    assert not marker.exists()


def test_another_runs_file_dropped_into_a_run_dir_is_refused_before_unpickling(tmp_path: Path) -> None:
    # Both runs share one token (ORCH_TOKEN set once): only the run id in the signature tells them apart.
    old, new = tmp_path / "run-old", tmp_path / "run-new"
    old.mkdir()
    new.mkdir()
    marker = tmp_path / "marker"
    write_function(old, _Marks(str(marker)), {}, "shared-token")
    (new / FUNCTION_FILE).write_bytes((old / FUNCTION_FILE).read_bytes())
    with pytest.raises(orch.WorkerError, match="does not carry the signature of run run-new"):
        read_function(new / FUNCTION_FILE, "shared-token")
    assert not marker.exists()


def test_a_function_file_that_is_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / FUNCTION_FILE
    os.mkfifo(fifo)
    with pytest.raises(orch.WorkerError, match="not a regular file"):
        read_function(fifo, "t")


def test_a_file_that_is_not_a_function_file_or_is_missing_is_named(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pkl"
    junk.write_bytes(b"\x80\x04hello")
    with pytest.raises(orch.WorkerError, match="not an orch function file"):
        read_function(junk, "t")
    with pytest.raises(orch.WorkerError, match="shared file system"):
        read_function(tmp_path / "absent.pkl", "t")


def test_orch_worker_refuses_a_tampered_function_file(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    marker = tmp_path / "marker"
    path = write_function(tmp_path, train, {}, subprocess_env["ORCH_TOKEN"])
    data = path.read_bytes()
    head = data.index(b"\n") + 1 + 32
    path.write_bytes(data[:head] + pickle.dumps({"fn": _Marks(str(marker)), "sources": {}}))
    proc = subprocess.run(
        [ORCH, "worker", "--master", "127.0.0.1:1", "--fn-file", str(path), "--timeout", "1"],
        capture_output=True,
        text=True,
        env=subprocess_env,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "does not carry the signature of run" in proc.stderr, proc.stderr
    assert not marker.exists()


def test_the_job_script_runs_one_agent_per_node(tmp_path: Path) -> None:
    cluster = Slurm(
        nodes=2,
        tasks_per_node=4,
        partition="gpu",
        time="2:00:00",
        gpus_per_node=4,
        setup=("module load cuda",),
        python="/shared/venv/bin/python",
    )
    script = job_script(
        cluster,
        run_id="abc123",
        run_dir=tmp_path / "abc123",
        master="10.0.0.5:50051",
        run_root=str(tmp_path),
        workdir="/home/me/project",
        fn_arg=["--fn-file", str(tmp_path / "abc123" / FUNCTION_FILE)],
    )
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for option in (
        "--job-name=orch-abc123", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=4", "--export=ALL",
        "--time=2:00:00",
        f"--output={tmp_path / 'abc123' / 'slurm-%j.out'}", "--chdir=/home/me/project", "--partition=gpu",
        "--gpus-per-node=4",
    ):  # fmt: skip
        assert f"#SBATCH {option}" in lines, (option, script)
    assert lines.index("module load cuda") > max(i for i, ln in enumerate(lines) if ln.startswith("#SBATCH"))
    srun = lines[-1]
    assert srun.startswith("exec srun --ntasks-per-node=1 --cpus-per-task=4 ")
    assert "/shared/venv/bin/python -m orch.worker --master 10.0.0.5:50051 --launcher none" in srun
    assert "--nproc-per-node 4" in srun and f"--fn-file {tmp_path / 'abc123' / FUNCTION_FILE}" in srun


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"nodes": 0}, "nodes=...) must be an integer >= 1"),
        ({"tasks_per_node": 1.5}, "tasks_per_node=...) must be an integer >= 1"),
        ({"time": "an hour"}, "is not a Slurm time limit"),
        ({"sbatch_args": "--qos=high"}, "sbatch_args=...) must be a tuple of strings"),
        ({"gpus_per_node": 0}, "gpus_per_node=...) must be an integer >= 1 or None"),
        ({"partition": "a b"}, "is not a partition name"),
    ],
)
def test_bad_cluster_arguments_are_config_errors(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(orch.ConfigError) as e:
        Slurm(**kwargs)  # type: ignore[arg-type]
    assert says in str(e.value)


@pytest.mark.parametrize("time", ["30", "1:00:00", "2-12", "1-00:00:00", "10:00", "UNLIMITED"])
def test_slurm_time_limits_are_taken(time: str) -> None:
    assert Slurm(time=time).time == time


def test_a_world_size_the_cluster_does_not_run_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(orch.ConfigError) as e:
        orch.launch(train, world_size=4, cluster=Slurm(nodes=2, tasks_per_node=3), run_root=str(tmp_path))
    assert "world_size=4 but the cluster runs 2 node(s) of 3 ranks, 6 ranks" in str(e.value)
    assert not any(tmp_path.iterdir())
    with pytest.raises(orch.ConfigError, match="a Slurm run's master lives in this process"):
        orch.launch(train, world_size=2, cluster=Slurm(nodes=2), detach=True, run_root=str(tmp_path))


def test_without_slurms_commands_the_launch_says_where_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(orch.ConfigError, match=r"sbatch, squeue, scancel not found on PATH: .* login node"):
        orch.launch(train, world_size=1, cluster=Slurm(), run_root=str(tmp_path))


@pytest.mark.parametrize(
    ("stderr", "says"),
    [
        ("sbatch: error: invalid partition specified: nope", "Slurm has no partition 'nope'"),
        (
            "sbatch: error: Batch job submission failed: Requested node configuration is not available",
            "the cluster has no nodes for 2 node(s) of 4 ranks",
        ),
        ("sbatch: error: Invalid time limit specification", "Slurm refused time='1:00:00'"),
        ("sbatch: error: Batch job submission failed: Unable to contact slurm controller", "scontrol ping"),
        ("sbatch: error: something else", "sbatch refused the job: something else"),
    ],
)
def test_sbatch_refusals_say_what_to_do(stderr: str, says: str) -> None:
    assert says in _explain(stderr, Slurm(nodes=2, tasks_per_node=4, partition="nope"))


def test_the_job_state_reads_as_people_say_it() -> None:
    from orch.wire.model import JobView

    assert (
        JobView("slurm", "41", "PENDING", "Resources").describe()
        == "slurm job 41: PENDING in the queue: Resources"
    )
    assert JobView("slurm", "41", "PENDING", "None").describe() == "slurm job 41: PENDING in the queue"
    assert (
        JobView("slurm", "41", "RUNNING", "None", "node[1-2]").describe()
        == "slurm job 41: RUNNING on node[1-2]"
    )


# -- a gang's ranks dialling the kernel back (orch.launchers.slurm.gang) ----------------------
def _dial(port: int, key: bytes, said: bytes | None) -> None:
    from multiprocessing.connection import Client

    with contextlib.suppress(Exception), Client(("127.0.0.1", port), authkey=key) as conn:
        if said is not None:
            conn.send_bytes(said)
        conn.recv_bytes()  # held open until the kernel's side closes


def _silent(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)):
        time.sleep(3)


def _admitted(
    key: bytes, said: bytes | None, *, silent: bool = False, seconds: float = 10.0
) -> tuple[int, Any] | None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    if silent:  # connects, then says nothing at all
        dialler = threading.Thread(target=_silent, args=(port,), daemon=True)
    else:
        dialler = threading.Thread(target=_dial, args=(port, key, said), daemon=True)
    dialler.start()
    sock, _ = server.accept()
    server.close()
    return admit(sock, b"the-gang-token", seconds=seconds)


def test_a_gang_rank_is_admitted_only_with_the_token_and_its_rank() -> None:
    taken = _admitted(b"the-gang-token", b"1")
    assert taken is not None and taken[0] == 1
    taken[1].close()
    assert _admitted(b"another-token", b"1") is None  # the challenge fails: nothing is read from it
    assert _admitted(b"the-gang-token", b"rank one") is None  # not a rank number
    started = time.monotonic()
    assert _admitted(b"the-gang-token", None, silent=True, seconds=1) is None  # a stranger that says nothing
    assert time.monotonic() - started < 3  # ... holds the gang's start for the handshake's bound only


def test_a_gang_job_script_runs_a_rank_per_task_that_dials_back(tmp_path: Path) -> None:
    cluster = Slurm(nodes=2, tasks_per_node=4, cpus_per_rank=2, setup=("module load x",))
    script = slurm_gang.gang_script(
        cluster, name="orch-gang-ab12-0", address="10.0.0.1:4321", folder=tmp_path, workdir="/w"
    )
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=4" in script
    assert "#SBATCH --cpus-per-task=2" in script and "#SBATCH --job-name=orch-gang-ab12-0" in script
    assert script.index("module load x") < script.index("exec srun")
    assert script.rstrip().endswith("-m orch.runtime.gang --connect 10.0.0.1:4321")
