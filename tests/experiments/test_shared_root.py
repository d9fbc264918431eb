"""A run root other users can write (``/tmp/runs``): what another user plants there is never
read. The other user is a real second uid (``setpriv --reuid nobody``, which needs root), the
readers real ``orch`` commands and the library calls; a read that hung would fail on its timeout."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import orch
from conftest import NOBODY, needs_second_uid, orch_cli
from orch.experiments.reuse import reuse_earlier
from orch.experiments.run_table import runs
from orch.experiments.trial import Trial
from orch.record.owned import MAX_LINE_BYTES
from orch.record.rundir import read_json

pytestmark = pytest.mark.timeout(300)

PLANT = r"""
import json, os, sys
root = sys.argv[1]
def run_dir(name, meta, result):
    d = os.path.join(root, name)
    os.mkdir(d)
    for file, value in (("run.json", meta), ("result.json", result)):
        if value is not None:
            with open(os.path.join(d, file), "w") as f:
                json.dump(value, f)
    return d
later = {"started": 4e9, "world_size": 1, "sweep": "s", "config_key": "theirs"}
done = {"state": "SUCCEEDED", "ranks": [{"rank": 0, "worker_id": "w0"}]}
os.mkfifo(os.path.join(run_dir("fifo", None, None), "run.json"))  # a read of it never returns
os.symlink("/dev/zero", os.path.join(run_dir("zero", later, None), "result.json"))
d = run_dir("sweep", later, done)  # a success of the victim's sweep, and the best loss
os.mkdir(os.path.join(d, "logs"))
with open(os.path.join(d, "logs", "w0.log"), "wb") as f:
    f.truncate(64 * 1024 * 1024)  # a log of one line, no newline
"""


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A world-writable run root (as /tmp is) holding one run of this user's and what user
    nobody planted beside it (under /tmp itself: pytest's own folders are closed to others)."""
    top = Path(tempfile.mkdtemp(prefix="orch-shared-root-"))
    try:
        top.chmod(0o755)
        yield _fill(top / "runs")
    finally:
        shutil.rmtree(top)


def _fill(root: Path) -> Path:
    root.mkdir(mode=0o1777)
    root.chmod(0o1777)
    mine = root / "mine"
    mine.mkdir(mode=0o700)
    (mine / "run.json").write_text(
        json.dumps(
            {"run_id": "mine", "started": time.time(), "world_size": 1, "sweep": "s", "config_key": "ours"}
        )
    )
    (mine / "result.json").write_text(
        json.dumps({"state": "SUCCEEDED", "ranks": [{"rank": 0, "worker_id": "w0"}]})
    )
    (mine / "logs").mkdir()
    with open(mine / "logs" / "w0.log", "wb") as f:
        f.write(b"first line\n" + b"x" * (4 * MAX_LINE_BYTES) + b"\nlast line\n")
    planted = subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            sys.executable,
            "-c",
            PLANT,
            str(root),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert planted.returncode == 0, planted.stderr
    assert {p.name for p in root.iterdir()} == {"mine", "fifo", "zero", "sweep"}
    assert all(os.lstat(root / name).st_uid == NOBODY for name in ("fifo", "zero", "sweep"))
    return root


@needs_second_uid
def test_runs_lists_only_this_users_run_dirs_and_never_hangs(
    shared_root: Path, subprocess_env: dict[str, str]
) -> None:
    table = runs(shared_root)
    assert [row.run_id for row in table] == ["mine"]
    out = orch_cli("runs", "--run-root", str(shared_root), "--json", env=subprocess_env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert [row["run_id"] for row in json.loads(out.stdout)] == ["mine"]


@needs_second_uid
@pytest.mark.parametrize("planted", ["fifo", "zero", "sweep"])
def test_show_logs_and_load_run_refuse_another_users_run_dir_by_owner_and_path(
    shared_root: Path, subprocess_env: dict[str, str], planted: str
) -> None:
    owner = f"{pwd.getpwuid(NOBODY).pw_name} (uid {NOBODY})"
    path = shared_root / planted
    for args in (("show", planted), ("logs", planted)):
        out = orch_cli(*args, "--run-root", str(shared_root), env=subprocess_env, timeout=120)
        assert out.returncode != 0 and f"{path} belongs to {owner}" in out.stderr, out.stderr
        assert len(out.stdout) < 10_000
    with pytest.raises(orch.OrchError, match=f"belongs to {pwd.getpwuid(NOBODY).pw_name}"):
        orch.load_run(path)


@needs_second_uid
def test_a_sweep_reuses_its_own_earlier_run_and_never_a_planted_one(shared_root: Path) -> None:
    ours = Trial(index=0, config={}, key="ours")
    theirs = Trial(index=1, config={}, key="theirs")  # only the planted run dir matches it
    reuse_earlier([ours, theirs], shared_root, "s")
    assert ours.reused and ours.run_dir == shared_root / "mine"
    assert not theirs.reused and theirs.run_dir is None


@needs_second_uid
def test_a_log_line_past_the_limit_is_cut(shared_root: Path, subprocess_env: dict[str, str]) -> None:
    out = orch_cli("logs", "mine", "--run-root", str(shared_root), env=subprocess_env, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "first line" and lines[-1] == "last line"
    assert (
        lines[1] == "x" * MAX_LINE_BYTES
        and lines[2] == f"[{3 * MAX_LINE_BYTES:,} more bytes of this line not shown]"
    )


def test_a_fifo_a_link_or_an_oversized_file_in_a_run_dir_is_refused_without_reading(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(orch.OrchError, match=r"fifo\.json is not a regular file \(prw"):
        read_json(tmp_path / "fifo.json")
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    with pytest.raises(orch.OrchError, match=r"zero\.json is a link"):
        read_json(tmp_path / "zero.json")
    with open(tmp_path / "big.json", "wb") as f:
        f.truncate(64 * 1024 * 1024)
    with pytest.raises(orch.OrchError, match=r"big\.json is over 16,777,216 bytes"):
        read_json(tmp_path / "big.json")
    assert read_json(tmp_path / "absent.json") == {}
