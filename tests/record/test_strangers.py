"""What another user plants in a shared run root is never written through, followed or trusted.

The stranger is a real second uid (``setpriv --reuid nobody``, which needs root; CI runs as
root); the victim is this test's process (root), or, where it says so, an ordinary user
(uid 1000, a forked child that dropped root). Each test first plants what a red-team pass
found orch wrote through, then runs the orch call that wrote, and checks that it refused,
naming what it refused, or (a ``.sweeps`` of theirs: in a shared root each user's sweeps are
in their own ``.orch-<uid>`` folder) that it ran without it, and that the stranger's file is
as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import orch
from conftest import NOBODY, needs_second_uid
from orch.experiments.study import storage_url
from orch.record.user_folders import user_folder
from orch.record.writes import UnsafePath, own_dir
from orch.runtime.checkpoints import write_checkpoint

pytestmark = [needs_second_uid, pytest.mark.timeout(300)]

ORDINARY = 1000  # the victim as an ordinary user


def as_stranger(code: str, *args: str) -> None:
    """Run ``code`` (Python) as user nobody, with ``args`` as sys.argv[1:]."""
    proc = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c", code,
         *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def as_user(uid: int, fn: Callable[[], Any]) -> Any:
    """``fn()`` in a forked child that dropped to ``uid``: what it returned, or the text of
    what it raised (``"raised: <type>: <message>"``)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no return from here
        os.close(r)
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            try:
                out: Any = fn()
            except Exception as e:
                out = f"raised: {type(e).__name__}: {e}"
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.fixture
def shared_root(sticky_root: Path) -> Path:
    return sticky_root


@pytest.fixture
def victim_file(shared_root: Path) -> Path:
    """A file of the victim's a planted link points at: it must stay as it is."""
    path = shared_root.parent / "victim.txt"
    path.write_text("the victim's own text\n")
    path.chmod(0o644)
    return path


def unchanged(path: Path) -> bool:
    st = path.stat()
    return path.read_text() == "the victim's own text\n" and stat.S_IMODE(st.st_mode) == 0o644


def sweep(root: Path, configs: Any = None, **options: Any) -> Any:
    """A sweep named train run to its end: in a shared root, in the user's own folder."""
    configs = orch.grid(lr=[0.1]) if configs is None else configs
    with orch.sweep(None, configs, world_size=1, steps=2, name="train", run_root=str(root), **options) as ran:
        ran.wait(timeout=120)
    assert [t.state for t in ran.trials] == ["SUCCEEDED"]
    assert ran.folder == root / f".orch-{os.geteuid()}" / "sweeps" / "train"
    return ran


def test_a_tmp_link_under_the_stranger_s_sweeps_folder(shared_root: Path, victim_file: Path) -> None:
    as_stranger(
        "import os, sys; d = os.path.join(sys.argv[1], '.sweeps', 'train'); os.makedirs(d);"
        "os.chmod(os.path.join(sys.argv[1], '.sweeps'), 0o777); os.chmod(d, 0o777);"
        "os.symlink(sys.argv[2], os.path.join(d, 'sweep.json.tmp'))",
        str(shared_root), str(victim_file),
    )  # fmt: skip
    sweep(shared_root)  # their .sweeps blocks nobody's sweeps: each user's are in their own folder
    assert unchanged(victim_file)
    assert os.listdir(shared_root / ".sweeps" / "train") == ["sweep.json.tmp"]  # nothing of ours in it
    with pytest.raises(UnsafePath, match=r"\.sweeps belongs to nobody \(uid 65534\)"):
        own_dir(shared_root / ".sweeps")  # and were orch to write there, it would refuse it


def test_sweeps_as_a_link(shared_root: Path) -> None:
    elsewhere = shared_root / "theirs"  # a folder of the stranger's
    as_stranger(
        "import os, sys; os.mkdir(sys.argv[2]); os.chmod(sys.argv[2], 0o777);"
        "os.symlink(sys.argv[2], os.path.join(sys.argv[1], '.sweeps'))",
        str(shared_root), str(elsewhere),
    )  # fmt: skip
    sweep(shared_root)
    assert os.listdir(elsewhere) == []  # no train/sweep.json made at the link's target
    assert os.readlink(shared_root / ".sweeps") == str(elsewhere)
    with pytest.raises(UnsafePath, match=r"\.sweeps is a link of nobody \(uid 65534\)'s"):
        own_dir(shared_root / ".sweeps" / "train")


def test_study_db_as_a_link(shared_root: Path, victim_file: Path) -> None:
    # The stranger's own folder: refused whole, before SQLite opens anything in it.
    as_stranger(
        "import os, sys; d = os.path.join(sys.argv[1], '.sweeps', 'train'); os.makedirs(d, 0o777);"
        "os.symlink(sys.argv[2], os.path.join(d, 'study.db'))",
        str(shared_root), str(victim_file),
    )  # fmt: skip
    with pytest.raises(UnsafePath, match=r"belongs to nobody"):
        storage_url(shared_root / ".sweeps" / "train")
    # In a folder of the victim's own, a study.db that is a link is refused too: never resolved.
    mine = shared_root / "mine"
    mine.mkdir(mode=0o700)
    (mine / "study.db").symlink_to(victim_file)
    with pytest.raises(UnsafePath, match=r"study\.db is a link"):
        storage_url(mine)
    assert unchanged(victim_file)


def test_the_stranger_s_own_study_db(shared_root: Path) -> None:
    pytest.importorskip("optuna")
    as_stranger(
        "import os, sys, sqlite3; d = os.path.join(sys.argv[1], '.sweeps', 'train'); os.makedirs(d, 0o777);"
        "sqlite3.connect(os.path.join(d, 'study.db')).close()",
        str(shared_root),
    )  # fmt: skip
    import optuna

    theirs = shared_root / ".sweeps" / "train" / "study.db"
    before = theirs.read_bytes()
    space = {"lr": orch.loguniform(1e-4, 1e-1)}
    # Their study blocks no sweep of the victim's, whose study is in the victim's own folder.
    ran = sweep(shared_root, space, trials=1, search=optuna.samplers.RandomSampler(seed=0))
    assert ran.storage == f"sqlite:///{(ran.folder / 'study.db').absolute()}"
    assert theirs.read_bytes() == before and theirs.stat().st_uid == NOBODY
    with pytest.raises(UnsafePath, match=r"belongs to nobody"):
        storage_url(theirs.parent)  # and were orch to open it, it would refuse it
    # In the victim's own sweep folder, another user's study.db is refused by its owner.
    mine = shared_root / "mine"
    mine.mkdir(mode=0o700)
    (mine / "study.db").touch()
    os.chown(mine / "study.db", NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match=r"study\.db belongs to nobody"):
        storage_url(mine)


def test_a_run_root_others_can_write_without_the_sticky_bit_is_refused(shared_root: Path) -> None:
    open_root = shared_root.parent / "open"
    open_root.mkdir()
    open_root.chmod(0o777)  # anyone can rename what is in it: a run dir could be swapped
    with pytest.raises(UnsafePath, match=r"lets every user write in it .* without the sticky bit"):
        orch.launch(world_size=1, steps=2, run_root=str(open_root / "runs"))
    assert os.listdir(open_root) == []  # refused before anything was written


@pytest.mark.timeout(600)
def test_the_run_dir_swap_race(shared_root: Path) -> None:
    """A poller of the stranger's renames every new run dir every 5 ms and puts a 0777 folder
    of theirs in its place, holding a result.json.tmp link: in a sticky root the renames fail,
    20 runs in a row succeed, and nothing is written outside each run's own folder."""
    bait = shared_root.parent / "bait.txt"
    bait.write_text("the victim's own text\n")
    bait.chmod(0o644)
    stop = shared_root.parent / "stop"
    poller = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c", SWAPPER,
         str(shared_root), str(bait), str(stop)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for _ in range(20):
            with orch.launch(world_size=1, steps=3, run_root=str(shared_root)) as run:
                assert run.wait(timeout=120).state is orch.RunState.SUCCEEDED
            # Every file of the run is the victim's, in the run's own folder, 0600 or 0700.
            for path in [run.run_dir, *run.run_dir.rglob("*")]:
                st = path.lstat()
                assert st.st_uid == os.geteuid() and not st.st_mode & 0o077, (path, stat.filemode(st.st_mode))
    finally:
        stop.touch()
        out, err = poller.communicate(timeout=30)
    tried = json.loads(out or "{}")
    assert tried.get("tries", 0) > 100, (out, err)  # it kept at it while the runs ran
    assert tried.get("swapped", 0) == 0, tried  # the sticky bit refused every rename
    assert unchanged(bait)
    planted = [p for p in shared_root.iterdir() if p.lstat().st_uid == NOBODY]
    assert all(not any(d.iterdir()) or {c.name for c in d.iterdir()} == {"result.json.tmp"} for d in planted)


SWAPPER = r"""
import json, os, sys, time
root, bait, stop = sys.argv[1:]
tries = swapped = 0
while not os.path.exists(stop):
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith(".") or os.lstat(path).st_uid == os.getuid():
            continue
        tries += 1
        try:
            os.rename(path, path + ".gone")
        except OSError:
            continue
        swapped += 1
        os.mkdir(path, 0o777)
        os.chmod(path, 0o777)
        os.symlink(bait, os.path.join(path, "result.json.tmp"))
    time.sleep(0.005)
print(json.dumps({"tries": tries, "swapped": swapped}))
"""


def test_checkpoint_names_orch_did_not_write(tmp_path: Path, victim_file: Path) -> None:
    """``step-final.pt`` and ``step-best.pt`` are the user's, a folder ``step-dir.pt`` and a link
    with orch's own name are not orch's files either: none is removed or written through."""
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True, mode=0o700)
    for name in ("step-final.pt", "step-best.pt"):
        torch.save({"user": name}, folder / name)
    (folder / "step-dir.pt").mkdir()
    (folder / "step-000000000.pt").symlink_to(victim_file)  # orch's name for step 0, a link
    for step in range(4):
        write_checkpoint(folder, step, 1, {"w": torch.tensor([float(step)])}, keep=2)
    names = sorted(os.listdir(folder))
    assert names == [
        "index.json", "latest", "step-000000002.pt", "step-000000003.pt", "step-best.pt", "step-dir.pt",
        "step-final.pt",
    ], names  # fmt: skip
    assert unchanged(victim_file)  # the link was replaced by step 0's file, then pruned: not written through
    assert torch.load(folder / "step-final.pt") == {"user": "step-final.pt"}
    for name in ("step-000000002.pt", "step-000000003.pt", "index.json", "latest"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy's, under MLflow's default store
def test_mlflow_s_default_store_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    with orch.launch(world_size=1, steps=3, run_root=str(tmp_path / "runs")) as run:
        run.wait(timeout=120)
    shared = tmp_path / "here"
    shared.mkdir()
    monkeypatch.chdir(shared)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run.to_mlflow()
    db = shared / "mlflow.db"
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    shared.chmod(0o755)
    tmp_path.chmod(0o755)
    probe = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "cat", str(db)],
        capture_output=True, timeout=30,
    )  # fmt: skip
    assert probe.returncode != 0 and b"Permission denied" in probe.stderr


@pytest.mark.parametrize("ending", ["succeeded", "failed", "stopped"])
def test_the_rendezvous_file_after_each_kind_of_ending(tmp_path: Path, ending: str) -> None:
    fn = "jobs:raise_on_rank1" if ending == "failed" else "jobs:allreduce_steps"
    config = {"steps": 100000, "sleep": 0.02} if ending == "stopped" else {"steps": 5}
    with orch.launch(fn, world_size=2, config=config, run_root=str(tmp_path)) as run:
        if ending == "stopped":
            deadline = time.monotonic() + 120
            while min((r.step for r in run.state().ranks), default=0) < 3 and time.monotonic() < deadline:
                time.sleep(0.1)
            run.stop()
        with contextlib.suppress(orch.RunFailed):
            run.wait(timeout=120)
        state = run.state().state.value
    assert state == ending.upper(), state
    left = [p.name for p in run.run_dir.iterdir() if p.name.startswith("rendezvous")]
    assert left == [], left


def test_the_victim_as_an_ordinary_user(shared_root: Path, victim_file: Path) -> None:
    """The same refusals for a user who is not root: .sweeps as a stranger's link, and theirs."""
    as_stranger(
        "import os, sys; os.symlink(sys.argv[2], os.path.join(sys.argv[1], '.sweeps'))",
        str(shared_root), str(victim_file.parent),
    )  # fmt: skip

    def make_sweeps_folder() -> str:  # as orch.sweep makes its folder
        try:
            own_dir(shared_root / ".sweeps").close()
            own_dir(shared_root / ".sweeps" / "train").close()
        except UnsafePath as e:
            return str(e)
        return "made"

    said = as_user(ORDINARY, make_sweeps_folder)
    assert ".sweeps is a link of nobody (uid 65534)'s" in said, said
    os.unlink(shared_root / ".sweeps")
    as_stranger("import os, sys; os.mkdir(os.path.join(sys.argv[1], '.sweeps'), 0o777)", str(shared_root))
    said = as_user(ORDINARY, make_sweeps_folder)
    assert ".sweeps belongs to nobody (uid 65534)" in said, said
    shutil.rmtree(shared_root / ".sweeps")
    assert as_user(ORDINARY, make_sweeps_folder) == "made"  # in a sticky root, a user's own folder works
    st = (shared_root / ".sweeps" / "train").lstat()
    assert st.st_uid == ORDINARY and stat.S_IMODE(st.st_mode) == 0o700
    # Where the user's sweeps go in the shared root: their own folder, passing over the
    # stranger's link at its name without following it.
    as_stranger(
        "import os, sys; os.symlink(sys.argv[2], os.path.join(sys.argv[1], '.orch-1000'))",
        str(shared_root), str(victim_file.parent),
    )  # fmt: skip
    folder = Path(as_user(ORDINARY, lambda: str(user_folder(shared_root, "sweeps"))))
    assert folder.name == "sweeps" and folder.parent.parent == shared_root
    assert folder.parent.name.startswith(".orch-1000.")
    st = folder.parent.lstat()
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == ORDINARY and stat.S_IMODE(st.st_mode) == 0o700
    assert unchanged(victim_file) and sorted(os.listdir(victim_file.parent)) == ["runs", "victim.txt"]


def test_a_swapped_run_dir_fails_the_run_with_that_cause(tmp_path: Path) -> None:
    """As the run's own user could (a root others can move things in is refused): the run dir
    is renamed and a folder put in its place while the run runs; the run fails saying so, and
    its record goes to the folder it was made as."""
    with orch.launch("jobs:allreduce_steps", world_size=1, config={"steps": 100000, "sleep": 0.02},
                     run_root=str(tmp_path)) as run:  # fmt: skip
        deadline = time.monotonic() + 120
        while min((r.step for r in run.state().ranks), default=0) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        moved = run.run_dir.with_name(run.run_dir.name + ".moved")
        run.run_dir.rename(moved)
        run.run_dir.mkdir(mode=0o700)
        with pytest.raises(orch.RunFailed, match="the run dir was swapped"):
            run.wait(timeout=60)
    assert os.listdir(run.run_dir) == []  # nothing written into the folder put in its place
    assert json.loads((moved / "result.json").read_text())["state"] == "FAILED"
