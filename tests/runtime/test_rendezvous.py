"""On one host the ranks meet through a file store in the run dir (0700), not a TCP store on a
port any local user can reach; another user cannot write into it, and the run trains."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import orch
from conftest import NOBODY, needs_second_uid, until
from orch.wire.states import RunState


@pytest.fixture
def open_root() -> Iterator[Path]:
    """A run root other users may look into (as /tmp): only the run dir itself is closed."""
    top = Path(tempfile.mkdtemp(prefix="orch-rdzv-"))
    try:
        top.chmod(0o755)
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def as_nobody(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )


@needs_second_uid
def test_another_user_cannot_write_into_the_rendezvous_and_the_run_trains(open_root: Path) -> None:
    with orch.launch(
        "jobs:allreduce_steps", world_size=2, config={"steps": 150, "sleep": 0.02}, run_root=str(open_root)
    ) as run:
        store = run.run_dir / "rendezvous.a1"
        until(lambda: store.exists() and run.state().ranks and run.state().ranks[0].step > 5, 60)
        # No rank serves a TCP store: the master never learned a port to hand out.
        assert run.coordinator.rendezvous_file and run.coordinator.active_rendezvous_port() == 0
        tried = as_nobody(
            f"import sys\ntry:\n    open({str(store)!r}, 'ab').write(b'x' * 1024)\n"
            "except PermissionError as e:\n    print('refused', e.errno)\n    sys.exit(0)\nsys.exit(3)"
        )
        assert tried.returncode == 0 and "refused" in tried.stdout, (tried.stdout, tried.stderr)
        result = run.wait(timeout=120)
    assert result.state is RunState.SUCCEEDED
    assert (run.run_dir.stat().st_mode & 0o777) == 0o700


def test_a_rendezvous_port_the_user_names_keeps_tcp(tmp_path: Path) -> None:
    from orch.wire.net import free_port

    port = free_port()
    with orch.launch("jobs:allreduce_steps", world_size=2, run_root=str(tmp_path), rdzv_port=port) as run:
        result = run.wait(timeout=120)
        assert not run.coordinator.rendezvous_file and run.coordinator.active_rendezvous_port() == port
    assert result.state is RunState.SUCCEEDED
