"""A sticky run root every user may write (as /tmp is) runs each user's sweeps and gangs as it
runs their runs. A user's sweep and gang folders are their own (``.orch-<uid>/sweeps/<name>``,
``.orch-<uid>/gangs/<id>``), so what another user planted (a ``.sweeps`` or ``.gangs`` of
theirs, a link or a folder at this user's own name) blocks nothing and is never followed or
written through. The stranger is a real second uid (``setpriv --reuid nobody``, which needs
root): it plants first, and runs a sweep and a gang of its own after root's, in the same root.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import jobs
import orch
from conftest import NOBODY, ROOT, TESTS, needs_second_uid
from orch.experiments.run_table import runs
from orch.record.user_folders import user_folder
from orch.record.writes import UnsafePath

pytestmark = [needs_second_uid, pytest.mark.timeout(300)]

ME = os.geteuid()

PLANT = r"""
import os, sys
root, theirs, me = sys.argv[1:]
os.mkdir(theirs)
os.chmod(theirs, 0o777)  # a folder of the stranger's that every user may write in
for name in (".sweeps", ".gangs", f".orch-{me}", f".orch-{me}.00"):
    os.symlink(theirs, os.path.join(root, name))
spare = os.path.join(root, f".orch-{me}.0")  # first by name of the spare names
os.mkdir(spare)
os.chmod(spare, 0o777)
"""

# The stranger's own sweep and gang, in a process of theirs. Where the kernel's Python lives
# under a home only root may enter (a venv of root's), the stranger's process runs, and the
# interpreter it was started from is reached through /proc/self/exe to start the workers' pool.
STRANGER_RUNS = r"""
import json, multiprocessing, os, sys
if not os.access(sys.executable, os.X_OK):
    multiprocessing.set_executable("/proc/self/exe")
import jobs, orch
root = sys.argv[1]
with orch.sweep(None, orch.grid(lr=[0.1]), world_size=2, steps=2, name="train", run_root=root) as sweep:
    sweep.wait(timeout=120)
    states = [t.state for t in sweep.trials]
gang = orch.gang(world_size=2, run_root=root)
try:
    ranks = [v["rank"] for v in gang.run(jobs.gang_where).wait(timeout=120).values]
finally:
    gang.close()
print(json.dumps({"sweep": str(sweep.folder), "states": states, "gang": str(gang.folder), "ranks": ranks}))
"""


@pytest.fixture
def shared_root(sticky_root: Path) -> Path:
    return sticky_root


def as_stranger(code: str, *args: str, cwd: Path | None = None, timeout: float = 60) -> str:
    """Run ``code`` (Python) as user nobody, ``args`` as sys.argv[1:]; its stdout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    if cwd is not None:
        env["HOME"] = str(cwd)
    proc = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c", code,
         *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def private_of(path: Path, uid: int) -> bool:
    """``path`` is a folder (not a link) of ``uid``'s that nobody else may enter."""
    st = path.lstat()
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and stat.S_IMODE(st.st_mode) == 0o700


def run_sweep(root: Path) -> orch.Sweep:
    configs = orch.grid(lr=[0.1])
    with orch.sweep(None, configs, world_size=2, steps=2, name="train", run_root=str(root)) as sweep:
        sweep.wait(timeout=120)
    assert [t.state for t in sweep.trials] == ["SUCCEEDED"]
    return sweep


def run_gang(root: Path) -> Path:
    gang = orch.gang(world_size=2, run_root=str(root))
    try:
        assert [v["rank"] for v in gang.run(jobs.gang_where).wait(timeout=120).values] == [0, 1]
        assert private_of(gang.folder, ME)  # the ranks' file store's folder, root's own
    finally:
        gang.close()
    return gang.folder


def test_root_s_gang_and_sweep_pass_over_what_the_stranger_planted(shared_root: Path) -> None:
    theirs = shared_root / ".theirs"  # the stranger may make names only in the shared root
    as_stranger(PLANT, str(shared_root), str(theirs), str(ME))

    gang_folder = run_gang(shared_root)
    mine = gang_folder.parent.parent  # .orch-<uid>.<random>: .orch-<uid> is the stranger's link
    assert mine.parent == shared_root and mine.name.startswith(f".orch-{ME}.") and len(mine.name) > 12
    assert private_of(mine, ME) and private_of(gang_folder.parent, ME)
    assert not gang_folder.exists()  # its file stores removed at close

    sweep = run_sweep(shared_root)
    assert sweep.folder == mine / "sweeps" / "train"  # the same folder of root's, found again
    record = sweep.folder / "sweep.json"
    assert record.lstat().st_uid == ME and stat.S_IMODE(record.lstat().st_mode) == 0o600
    again = run_sweep(shared_root)  # the same cell again: found by its name, its trial reused
    assert again.folder == sweep.folder and again.trials[0].reused

    # Nothing written through the stranger's links or in their folders; each is as planted.
    assert os.listdir(theirs) == [] and os.listdir(shared_root / f".orch-{ME}.0") == []
    for name in (".sweeps", ".gangs", f".orch-{ME}", f".orch-{ME}.00"):
        link = shared_root / name
        assert os.readlink(link) == str(theirs) and link.lstat().st_uid == NOBODY
    # The listing holds the runs only: the gang's call and the sweep's trial, no folder of orch's.
    listed = {row.run_id for row in runs(shared_root)}
    assert listed == {p.name for p in shared_root.iterdir() if not p.name.startswith(".")}
    assert len(listed) == 2 and sweep.trials[0].run_id in listed


def test_the_stranger_s_sweep_and_gang_run_after_root_s_in_the_same_root(shared_root: Path) -> None:
    sweep = run_sweep(shared_root)
    gang_folder = run_gang(shared_root)
    mine = shared_root / f".orch-{ME}"
    assert sweep.folder == mine / "sweeps" / "train" and gang_folder.parent == mine / "gangs"
    assert private_of(mine, ME)
    record = (sweep.folder / "sweep.json").read_bytes()

    home = shared_root.parent / "home"  # the stranger's own working folder
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    said = json.loads(as_stranger(STRANGER_RUNS, str(shared_root), cwd=home, timeout=240).splitlines()[-1])

    theirs = shared_root / f".orch-{NOBODY}"
    assert said["states"] == ["SUCCEEDED"] and said["ranks"] == [0, 1]
    assert Path(said["sweep"]) == theirs / "sweeps" / "train"
    assert Path(said["gang"]).parent == theirs / "gangs"
    assert private_of(theirs, NOBODY) and private_of(theirs / "sweeps" / "train", NOBODY)
    assert (theirs / "sweeps" / "train" / "sweep.json").lstat().st_uid == NOBODY
    assert (sweep.folder / "sweep.json").read_bytes() == record  # root's own sweep as it was
    # Each user's listing holds their own runs only.
    listed = runs(shared_root)
    assert len(listed) == 2 and all(row.path.lstat().st_uid == ME for row in listed)


def test_a_run_root_of_the_user_s_own_keeps_sweeps_and_gangs(tmp_path: Path) -> None:
    """A root only this user writes keeps the layout earlier sweeps are found again in."""
    tmp_path.chmod(0o755)
    assert user_folder(tmp_path, "sweeps") == tmp_path / ".sweeps"
    assert user_folder(tmp_path, "gangs") == tmp_path / ".gangs"
    assert user_folder(tmp_path / "not-yet", "sweeps") == tmp_path / "not-yet" / ".sweeps"
    assert os.listdir(tmp_path) == []  # deciding makes nothing


def test_a_root_others_can_write_without_the_sticky_bit_is_still_refused(shared_root: Path) -> None:
    open_root = shared_root.parent / "open"
    open_root.mkdir()
    open_root.chmod(0o777)
    for start in (
        lambda: orch.gang(world_size=2, run_root=str(open_root)),
        lambda: orch.sweep(None, orch.grid(lr=[0.1]), world_size=2, steps=2, run_root=str(open_root)),
    ):
        with pytest.raises(UnsafePath, match=r"lets every user write in it .* make it sticky \(chmod \+t"):
            start()
    assert os.listdir(open_root) == []  # refused before anything was made
