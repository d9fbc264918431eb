"""What a worker takes from its master, and what a run leaves on disk and on a terminal.

A worker trusts nothing from the master that becomes a path or code: the run id (a folder),
the training function it names (an import), the checkpoint ``latest`` names (a file that is
unpickled). A fake master here, a real gRPC server, sends hostile values; the worker must
refuse each before it writes or imports anything. Also: the rendezvous store listens on the
advertised address only, run dirs are private, remote text reaches a terminal without its
control sequences, and a token can come from a file.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
import torch

import orch
from conftest import ORCH, orch_cli
from orch._text import printable
from orch.master.control.plan import RunPlan
from orch.master.coordinator import Coordinator
from orch.master.server import MasterServer
from orch.runtime.context import Context
from orch.runtime.spec import WorkerSpec
from orch.runtime.worker import run_worker
from orch.views.rendering import render, summary
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire._proto import orchestrator_pb2_grpc as pb_grpc
from orch.wire.states import RunState

pytestmark = pytest.mark.timeout(300)

RPC_DEADLINE = 30.0


def listeners(port: int) -> list[str]:
    """The addresses with a TCP socket in LISTEN on ``port`` (IPv4 and IPv6)."""
    return sorted(
        c.laddr.ip
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
    )


class FakeMaster(pb_grpc.OrchestratorServicer):
    """A master that answers Register with whatever a test wants, then refuses the barrier."""

    def __init__(self, run_id: str, fn: str = "", rendezvous_port: int = 0) -> None:
        self.run_id, self.fn, self.rendezvous_port = run_id, fn, rendezvous_port
        self.completions: list[pb.CompletionRequest] = []
        self.rendezvous_listeners: list[str] | None = None

    def Register(self, request: pb.RegisterRequest, context: Any) -> pb.RegisterResponse:
        if request.rendezvous_port:  # rank 0 reports the store it just bound: look at its socket
            self.rendezvous_listeners = listeners(request.rendezvous_port)
            return pb.RegisterResponse(run_id=self.run_id, rank=0, world_size=1)
        return pb.RegisterResponse(
            run_id=self.run_id,
            rank=0,
            world_size=1,
            fn=self.fn,
            heartbeat_timeout=5.0,
            rendezvous_port=self.rendezvous_port,
        )

    def CanStartTraining(self, request: pb.CanStartTrainingRequest, context: Any) -> Any:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the fake master ends the run here")

    def ReportCompletion(self, request: pb.CompletionRequest, context: Any) -> pb.CompletionResponse:
        self.completions.append(request)
        return pb.CompletionResponse()


@pytest.fixture
def fake() -> Iterator[tuple[FakeMaster, str]]:
    servicer = FakeMaster("r1")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_OrchestratorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        server.stop(0)


def spec(address: str, root: Path, **kwargs: Any) -> WorkerSpec:
    return WorkerSpec(
        master=address,
        run_root=str(root),
        register_timeout=RPC_DEADLINE,
        advertise_addr="127.0.0.1",
        threads=1,
        **kwargs,
    )


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*")) if folder.exists() else []


# -- the run id ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["absolute", "../x", "..", "a/b", "", "x" * 129, "-x", "a..b"])
def test_a_hostile_run_id_is_refused_before_anything_is_written(
    fake: tuple[FakeMaster, str], tmp_path: Path, kind: str
) -> None:
    servicer, address = fake
    sandbox = tmp_path / "sandbox"
    root = sandbox / "root"
    servicer.run_id = str(sandbox / "abs") if kind == "absolute" else kind
    # A function that cannot be imported: a worker that took the run id would write its error
    # file under root/<run id>/errors/, which for these ids is outside root.
    with pytest.raises(orch.WorkerError, match="unsafe run id"):
        run_worker(spec(address, root, fn="no_such_module_here:train"))
    assert files_under(sandbox) == []


def test_a_plain_run_id_is_used(fake: tuple[FakeMaster, str], tmp_path: Path) -> None:
    servicer, address = fake
    servicer.run_id = "Run_1.b-2"
    assert run_worker(spec(address, tmp_path, fn="no_such_module_here:train")) == 1
    (error,) = (tmp_path / "Run_1.b-2" / "errors").iterdir()
    assert "no_such_module_here" in json.loads(error.read_text())["traceback"]
    assert servicer.completions[-1].outcome == pb.RANK_FAILED


# -- the function the master names ----------------------------------------------------------------

EVIL_MODULE = """
from pathlib import Path
Path({marker!r}).write_text("imported")  # importing this module is enough to run code

def train(ctx):
    Path({marker!r}).write_text("ran")
"""


@pytest.mark.parametrize("fn", ["builtins:print", "os:system", "evil_named_by_master:train"])
def test_a_function_named_by_a_plaintext_master_is_refused(
    fake: tuple[FakeMaster, str], tmp_path: Path, fn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    servicer, address = fake
    marker = tmp_path / "marker"
    (tmp_path / "evil_named_by_master.py").write_text(EVIL_MODULE.format(marker=str(marker)))
    monkeypatch.setattr(sys, "path", list(sys.path))
    servicer.fn = fn
    with pytest.raises(orch.WorkerError) as e:
        run_worker(spec(address, tmp_path / "root", workdir=str(tmp_path)))
    message = str(e.value)
    assert fn in message
    for option in ("--fn package.module:function", "--tls-ca", "--trust-master"):
        assert option in message
    assert not marker.exists()
    assert "evil_named_by_master" not in sys.modules
    assert files_under(tmp_path / "root") == []
    # The master hears why, so that a real one shows it instead of waiting for the rank.
    (done,) = servicer.completions
    assert done.outcome == pb.RANK_FAILED and "--trust-master" in done.error
    assert "fails the whole run" in message


def test_orch_worker_without_trust_warns_before_it_joins(
    fake: tuple[FakeMaster, str], tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    servicer, address = fake
    servicer.fn = "some_module_of_the_master:train"
    worker = orch_cli(
        "worker", "--master", address, "--run-root", str(tmp_path / "root"), env=subprocess_env, timeout=120
    )
    assert worker.returncode != 0
    warning = worker.stderr.find("warning: without --fn, --tls-ca or --trust-master")
    refusal = worker.stderr.find("names the training function 'some_module_of_the_master:train'")
    assert 0 <= warning < refusal, worker.stderr  # said first, then the refusal it warned of
    assert "fails the whole run" in worker.stderr[warning:refusal]
    # Told what to run (or to trust the master), it says nothing of the kind.
    servicer.fn = ""
    quiet = orch_cli(
        "worker", "--master", address, "--trust-master", "--run-root", str(tmp_path / "r2"),
        env=subprocess_env, timeout=120,
    )  # fmt: skip
    assert "warning: without --fn" not in quiet.stderr, quiet.stderr


def test_trust_master_runs_the_named_function_and_the_example_always_runs(
    fake: tuple[FakeMaster, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    servicer, address = fake
    marker = tmp_path / "marker"
    (tmp_path / "trusted_by_worker.py").write_text(EVIL_MODULE.format(marker=str(marker)))
    monkeypatch.setattr(sys, "path", list(sys.path))
    servicer.fn = "trusted_by_worker:train"
    # Told to trust: the module is imported (then the fake master's barrier ends the run).
    assert run_worker(spec(address, tmp_path / "root", workdir=str(tmp_path), trust_master=True)) == 1
    assert marker.read_text() == "imported"
    assert "--trust-master" not in servicer.completions[-1].error
    assert "ends the run here" in servicer.completions[-1].error
    # The built-in example needs no trust: it is orch's own code.
    servicer.fn = "orch.example:train"
    assert run_worker(spec(address, tmp_path / "root2")) == 1
    assert "ends the run here" in servicer.completions[-1].error


# -- the rendezvous store ---------------------------------------------------------------------------


def test_the_rendezvous_store_listens_on_the_advertised_address_only(
    fake: tuple[FakeMaster, str], tmp_path: Path
) -> None:
    servicer, address = fake
    servicer.fn = "orch.example:train"
    assert run_worker(spec(address, tmp_path)) == 1  # the fake master ends it at the barrier
    # Seen by the fake master while the store was up: one socket, on 127.0.0.1, no wildcard.
    assert servicer.rendezvous_listeners == ["127.0.0.1"]


def test_a_fixed_rendezvous_port_taken_on_the_advertised_address_is_named(
    fake: tuple[FakeMaster, str], tmp_path: Path
) -> None:
    import socket

    servicer, address = fake
    servicer.fn = "orch.example:train"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        servicer.rendezvous_port = taken.getsockname()[1]
        assert run_worker(spec(address, tmp_path)) == 1
    assert "rdzv_port" in servicer.completions[-1].error
    assert servicer.rendezvous_listeners is None


# -- checkpoints ----------------------------------------------------------------------------------


class RunsCode:
    """Unpickling this creates ``marker``: what a hostile checkpoint does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def context(checkpoint_dir: Path) -> Context:
    return Context(
        rank=0,
        world_size=1,
        local_rank=0,
        device=torch.device("cpu"),
        config={},
        run_id="r",
        sender=None,
        checkpoint_dir=checkpoint_dir,
    )


def hostile_checkpoint(path: Path, marker: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"step": 5, "attempt": 1, "state": RunsCode(marker)}, path)


def test_model_and_optimizer_state_round_trips_weights_only(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    saved = context(tmp_path / "run" / "checkpoints")
    path = saved.save_checkpoint({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": 2}, step=7)
    assert path is not None and path.name == "step-000000007.pt"
    loaded = context(tmp_path / "run" / "checkpoints")
    state = loaded.load_checkpoint()  # weights_only=True by default
    assert loaded.resume_step == 8 and state["epoch"] == 2
    assert torch.equal(state["model"]["weight"], model.state_dict()["weight"])
    opt2 = torch.optim.Adam(torch.nn.Linear(4, 2).parameters())
    opt2.load_state_dict(state["opt"])


@pytest.mark.parametrize(
    "name", ["../../evil.pt", "/abs/evil.pt", "step-1.pt", "latest", "step-000000005.pt/", ""]
)
def test_latest_must_name_a_checkpoint_of_the_folder(tmp_path: Path, name: str) -> None:
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.save({"step": 5, "attempt": 1, "state": {}}, tmp_path / "evil.pt")  # loadable, outside
    (checkpoints / "latest").write_text(name)
    with pytest.raises(orch.OrchError, match="not a checkpoint"):
        context(checkpoints).load_checkpoint()


def test_a_checkpoint_that_would_run_code_loads_only_when_asked(tmp_path: Path) -> None:
    checkpoints, marker = tmp_path / "run" / "checkpoints", tmp_path / "marker"
    hostile_checkpoint(checkpoints / "step-000000005.pt", marker)
    (checkpoints / "latest").write_text("step-000000005.pt")
    with pytest.raises(orch.OrchError, match=r"load_checkpoint\(weights_only=False\)"):
        context(checkpoints).load_checkpoint()
    assert not marker.exists()
    # The documented opt-out, for a state of arbitrary objects from a folder only you write.
    opened = context(checkpoints).load_checkpoint(weights_only=False)
    opened.close()
    assert marker.exists()


LOADS_A_CHECKPOINT = """
def train(ctx):
    ctx.load_checkpoint()
"""


@pytest.mark.parametrize("latest", ["step-000000005.pt", "../../evil.pt"])
def test_a_worker_refuses_a_hostile_checkpoint(
    tmp_path: Path, subprocess_env: dict[str, str], latest: str
) -> None:
    root, marker = tmp_path / "root", tmp_path / "marker"
    checkpoints = root / "victim" / "checkpoints"
    hostile_checkpoint(checkpoints / "step-000000005.pt", marker)
    hostile_checkpoint(root / "evil.pt", marker)
    (checkpoints / "latest").write_text(latest)
    (tmp_path / "loads_a_checkpoint.py").write_text(LOADS_A_CHECKPOINT)
    coord = Coordinator(RunPlan(1, heartbeat_timeout=30.0), run_id="victim")
    server = MasterServer(coord, port=0, token=subprocess_env["ORCH_TOKEN"]).start()
    try:
        worker = orch_cli(
            "worker",
            "--master",
            server.address,
            "--fn",
            "loads_a_checkpoint:train",
            "--run-root",
            str(root),
            "--threads",
            "1",
            env=subprocess_env,
            cwd=tmp_path,
            timeout=120,
        )
    finally:
        server.stop(grace=0.2)
    assert worker.returncode == 1, worker.stderr[-3000:]
    assert not marker.exists()
    (error,) = (root / "victim" / "errors").iterdir()
    traceback = json.loads(error.read_text())["traceback"]
    assert "OrchError" in traceback
    assert ("weights_only=False" if latest.startswith("step") else "not a checkpoint") in traceback
    assert coord.state is RunState.FAILED


# -- run dirs are private -----------------------------------------------------------------------------

CHECKPOINT_THEN_FAIL = """
import torch
import torch.distributed as dist

def train(ctx):
    ctx.log(0, loss=1.0)
    if ctx.rank == 0:
        ctx.save_checkpoint({"w": torch.zeros(2)}, step=0)
    dist.barrier()
    if ctx.rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
"""


def test_a_run_dir_is_0700_and_its_files_0600(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "checkpoint_then_fail.py").write_text(CHECKPOINT_THEN_FAIL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    old = os.umask(0o022)  # the usual umask, which alone would leave everything world-readable
    try:
        run = orch.launch("checkpoint_then_fail:train", world_size=2, run_root=str(tmp_path / "runs"))
        with run, pytest.raises(orch.RunFailed):
            run.wait(timeout=120)
    finally:
        os.umask(old)
    run_dir = tmp_path / "runs" / run.run_id
    found = files_under(run_dir)
    names = {p.relative_to(run_dir).as_posix() for p in found}
    for expected in (
        "run.json",
        "result.json",
        "metrics.pb",
        "events.jsonl",
        "logs",
        "errors",
        "checkpoints",
        "checkpoints/latest",
        "checkpoints/step-000000000.pt",
    ):
        assert expected in names, sorted(names)
    assert any(n.startswith("logs/") for n in names) and any(n.startswith("errors/") for n in names)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    modes = {p.relative_to(run_dir).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in found}
    wrong = {n: oct(m) for n, m in modes.items() if m != (0o700 if (run_dir / n).is_dir() else 0o600)}
    assert wrong == {}


# -- terminal output ------------------------------------------------------------------------------

HOSTILE_HOST = "evil\x1b]0;pwned\x07\x1b[2J"
HOSTILE_TRACEBACK = "Traceback:\n\tboom\x1b[31m red\x1b[0m\r\x9b2J\x00end\x1bP+q\x1b\\"


def hostile_mirror() -> orch.StateMirror:
    c = Coordinator(RunPlan(1), run_id="r")
    c.register(pb.RegisterRequest(worker_id="w", host=HOSTILE_HOST, pid=7, rendezvous_port=1))
    c.can_start(pb.CanStartTrainingRequest(run_id="r", worker_id="w"))
    c.complete(
        pb.CompletionRequest(run_id="r", worker_id="w", outcome=pb.RANK_FAILED, error=HOSTILE_TRACEBACK)
    )
    m = orch.StateMirror()
    m.apply(c.snapshot())
    return m


def assert_no_controls(text: str) -> None:
    assert not any((ord(ch) < 0x20 and ch not in "\n\t") or 0x7F <= ord(ch) <= 0x9F for ch in text), repr(
        text
    )


def test_printable_strips_whole_sequences_and_keeps_newlines_and_tabs() -> None:
    assert printable(HOSTILE_HOST) == "evil"
    assert printable(HOSTILE_TRACEBACK) == "Traceback:\n\tboom redend"
    assert printable("a\nb\tc", one_line=True) == "a b c"
    assert printable("plain text, ünïcode ✓") == "plain text, ünïcode ✓"


def test_the_dashboard_and_summary_show_remote_text_without_escapes() -> None:
    m = hostile_mirror()
    table, final = render(m, address="127.0.0.1:1"), summary(m)
    for text in (table, final):
        assert_no_controls(text.replace("\n", "").replace("\t", ""))
        assert "pwned" not in text
    assert "evil/7" in table
    assert "boom red" in final


def test_orch_status_prints_a_hostile_host_name_without_its_escapes(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    token = subprocess_env["ORCH_TOKEN"]
    coord = Coordinator(RunPlan(2), run_id="r")
    server = MasterServer(coord, port=0, token=token).start()
    try:
        coord.register(pb.RegisterRequest(worker_id="w", host=HOSTILE_HOST, pid=7, rendezvous_port=1))
        status = orch_cli("status", "--master", server.address, env=subprocess_env, timeout=60)
    finally:
        server.stop(grace=0.2)
    assert status.returncode == 0, status.stderr
    assert "evil/7" in status.stdout
    assert "\x1b" not in status.stdout and "\x07" not in status.stdout


# -- --token-file ---------------------------------------------------------------------------------


def test_token_file_for_master_worker_and_status(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    env = {k: v for k, v in subprocess_env.items() if k != "ORCH_TOKEN"}
    token = uuid.uuid4().hex
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    master = subprocess.Popen(
        [
            *(ORCH, "master", "--world-size", "1", "--port", "0", "--no-dashboard", "--linger", "0"),
            *("--steps", "3", "--run-root", str(tmp_path), "--token-file", str(token_file)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        assert master.stdout is not None
        line = master.stdout.readline()
        address = line.split("serving on ")[1].split(";")[0]
        assert token not in " ".join(psutil.Process(master.pid).cmdline())
        assert "ORCH_TOKEN=<token>" not in line  # it did not make a token of its own
        status = orch_cli("status", "--master", address, "--json", "--token-file", str(token_file), env=env)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["world_size"] == 1
        wrong = tmp_path / "wrong"
        wrong.write_text("not-the-token")
        denied = orch_cli("status", "--master", address, "--token-file", str(wrong), env=env, timeout=60)
        assert denied.returncode == 1 and "wrong token" in denied.stderr
        worker = orch_cli(
            *("worker", "--master", address, "--token-file", str(token_file), "--threads", "1"),
            *("--run-root", str(tmp_path)),
            env=env,
            timeout=120,
        )
        assert worker.returncode == 0, worker.stderr[-3000:]
        out, _ = master.communicate(timeout=60)
        assert master.returncode == 0, out
    finally:
        if master.poll() is None:
            master.kill()
        master.communicate()


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read"), ("", "is empty"), ("\n", "is empty"), ("a\nb\n", "more than one line")],
)
def test_a_bad_token_file_is_a_clear_usage_error(
    tmp_path: Path, subprocess_env: dict[str, str], content: str | None, message: str
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    for command in ("status", "worker"):
        result = orch_cli(
            command, "--master", "127.0.0.1:1", "--token-file", str(path), env=subprocess_env, timeout=60
        )
        assert result.returncode == 2, result.stderr
        assert "--token-file" in result.stderr and message in result.stderr


def test_token_and_token_file_are_exclusive(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    result = orch_cli(
        *("status", "--master", "127.0.0.1:1", "--token", "x", "--token-file", str(tmp_path / "t")),
        env=subprocess_env,
        timeout=60,
    )
    assert result.returncode == 2 and "not allowed with" in result.stderr
