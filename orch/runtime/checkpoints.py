"""Checkpoint files in a run dir: written atomically by rank 0, read back on a restart.

``checkpoints/step-<step>.pt`` (0600, fsynced, renamed into place), the newest two kept,
and ``checkpoints/latest`` naming the newest. A restarted attempt's :meth:`Context.load_checkpoint`
reads the one ``latest`` names, refusing a name that is not one of these files.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from orch.errors import OrchError
from orch.record.store import private_dir, private_opener

CHECKPOINT_NAME = re.compile(r"step-[0-9]{9,19}\.pt")  # the names write_checkpoint makes (int64 steps)


def write_checkpoint(checkpoint_dir: Path, step: int, attempt: int, state: Any) -> Path:
    """Write ``state`` as of ``step``, atomically; point ``latest`` at it; keep the newest two."""
    private_dir(checkpoint_dir.parent)  # the run dir, 0700 like everything in it
    private_dir(checkpoint_dir)
    path = checkpoint_dir / f"step-{step:09d}.pt"
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb", opener=private_opener) as f:
        torch.save({"step": step, "attempt": attempt, "state": state}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    latest = checkpoint_dir / "latest"
    latest_tmp = checkpoint_dir / "latest.tmp"
    with open(latest_tmp, "w", opener=private_opener) as f:
        f.write(path.name)
    os.replace(latest_tmp, latest)
    for old in sorted(checkpoint_dir.glob("step-*.pt"))[:-2]:
        old.unlink(missing_ok=True)  # keep the newest two
    return path


def read_checkpoint(checkpoint_dir: Path, device: torch.device, *, weights_only: bool) -> Any:
    """The newest checkpoint's record (``{"step", "attempt", "state"}``), or None when there is none."""
    try:
        name = (checkpoint_dir / "latest").read_text().strip()
    except FileNotFoundError:
        return None
    if not CHECKPOINT_NAME.fullmatch(name):
        raise OrchError(
            f"{checkpoint_dir / 'latest'} names {name[:200]!r}, not a checkpoint this run "
            "wrote (step-<digits>.pt in the same folder): move the folder aside to start afresh"
        )
    path = checkpoint_dir / name
    try:
        return torch.load(path, map_location=device, weights_only=weights_only)
    except pickle.UnpicklingError as e:
        raise OrchError(
            f"{path} holds objects that a weights-only load refuses ({e}); if the file is your "
            "own and nobody else can write its folder, load it with "
            "ctx.load_checkpoint(weights_only=False)"
        ) from e
