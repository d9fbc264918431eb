"""Where a user's sweeps and gangs keep their folders in a run root.

A sweep keeps ``sweep.json`` and its Optuna study in a folder named after it, found again by
that name when its cell runs again; a gang keeps its ranks' file store in a folder of its id.
Runs have a folder each in the run root itself, so a shared root (``/tmp/runs``, sticky, as
``/tmp`` is) holds every user's runs side by side; one name for everyone's sweeps would let
whoever made it first (a link, a folder of theirs) block the others. So:

- in a run root only this user can write (their own, not writable by others): ``.sweeps/<name>``
  and ``.gangs/<id>``, as ever;
- in a shared run root (another user's, or one others may write in): a folder of this user's
  own, ``.orch-<uid>/sweeps/<name>`` and ``.orch-<uid>/gangs/<id>``, made 0700 through
  :func:`~orch.record.writes.user_dir`. Where another user took ``.orch-<uid>`` first (a
  link, a folder of theirs), it is passed over and ``.orch-<uid>.<random>`` is made and found
  again instead.

Which of the two is decided by the root as it is when a sweep or gang starts: a root made
shared later (``chmod 1777``) finds its earlier sweeps no longer. None of these folders holds a
run's files, so ``orch runs`` and ``orch.runs()`` list none of them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from orch.record.writes import others_may_write, user_dir


def user_folder(run_root: str | Path, kind: Literal["sweeps", "gangs"]) -> Path:
    """The folder that holds this user's sweeps (or gangs) in ``run_root`` (see the module
    docstring). In a shared root this user's own folder is made (0700) if it is not there;
    the ``sweeps``/``gangs`` folder in it is made by the sweep or gang that writes there."""
    root = Path(run_root)
    if not others_may_write(root):
        return root / f".{kind}"
    with user_dir(root, f".orch-{os.geteuid()}") as mine:
        return root / mine.path.name / kind
