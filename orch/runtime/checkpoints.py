"""Checkpoint files in a run dir: written atomically by rank 0, read back on a restart.

``checkpoints/step-<step>.pt`` (0600, fsynced, renamed into place), ``checkpoints/latest``
naming the newest, and ``checkpoints/index.json`` ranking them by the metric each was saved
with (:mod:`orch.record.checkpoint_index`): a write keeps the ``keep`` best plus the newest
(without a metric, the ``keep`` newest; by default two). A restarted attempt's
:meth:`Context.load_checkpoint` reads the one ``latest`` names, refusing a name that is not
one of these files.

A newest checkpoint that cannot be read back whole (a truncated file, bytes that fail the
archive's CRC, a file that is no checkpoint at all) is not the end of the run: the load falls
back to the newest one that loads, and says so in the rank's log, naming both. Rank 0 moves
the damaged file aside (``step-<step>.pt.corrupt``) and points ``latest`` and the index at
the one loaded, so that no later ranking counts it.
"""

from __future__ import annotations

import logging
import pickle
import time
import zipfile
from pathlib import Path
from typing import Any

import torch

from orch.errors import OrchError
from orch.record.checkpoint_index import (
    CHECKPOINT_NAME,
    Checkpoint,
    Mode,
    keep_best,
    read_index,
    write_index,
)
from orch.record.writes import own_dir, private_dir

__all__ = ["CHECKPOINT_NAME", "read_checkpoint", "write_checkpoint"]

log = logging.getLogger(__name__)


def write_checkpoint(
    checkpoint_dir: Path,
    step: int,
    attempt: int,
    state: Any,
    *,
    value: float | None = None,
    metric: str = "",
    keep: int = 2,
    mode: Mode = "min",
) -> Path:
    """Write ``state`` as of ``step``, atomically; point ``latest`` at it; keep the ``keep``
    best by ``value`` (``mode``) plus this newest one."""
    private_dir(checkpoint_dir.parent)  # the run dir, 0700 like everything in it
    path = checkpoint_dir / f"step-{step:09d}.pt"
    record = {
        "step": step,
        "attempt": attempt,
        "state": state,
        "metric": metric,
        "value": value,
        "time": time.time(),
    }
    with own_dir(checkpoint_dir) as folder:
        with folder.atomic(path.name) as f:
            torch.save(record, f)
        written, _ = read_index(checkpoint_dir)
        written = [c for c in written if c.name != path.name]  # a restart replays a step: the new file counts
        kept = keep_best([*written, Checkpoint(path, step, value, metric)], keep, mode)
        write_index(checkpoint_dir, kept, mode)
        folder.put("latest", path.name.encode())
        names = {c.name for c in kept}
        for name in folder.names():
            # Only orch's own files: its exact names (step-<digits>.pt), and regular files, never
            # a folder or what a link points at; step-final.pt or step-best.pt are the user's.
            if CHECKPOINT_NAME.fullmatch(name) and name not in names and folder.is_file(name):
                folder.remove(name)
    return path


def read_checkpoint(
    checkpoint_dir: Path, device: torch.device, *, weights_only: bool, writer: bool = False
) -> Any:
    """The newest checkpoint's record (``{"step", "attempt", "state", ...}``) that loads, or None
    when there is none. ``writer``: this rank (0) tidies after a fallback (see the module docstring)."""
    try:
        name = (checkpoint_dir / "latest").read_text().strip()
    except FileNotFoundError:
        return None
    if not CHECKPOINT_NAME.fullmatch(name):
        raise OrchError(
            f"{checkpoint_dir / 'latest'} names {name[:200]!r}, not a checkpoint this run "
            "wrote (step-<digits>.pt in the same folder): move the folder aside to start afresh"
        )
    listed, mode = read_index(checkpoint_dir)
    candidates = [name, *(c.name for c in reversed(listed) if c.name != name)]
    damaged: list[tuple[Path, str]] = []
    for candidate in candidates:
        path = checkpoint_dir / candidate
        saved, why = _load(path, device, weights_only)
        if why:
            damaged.append((path, why))
            continue
        if damaged:
            _fell_back(checkpoint_dir, damaged, path, int(saved["step"]), listed, mode, writer)
        return saved
    raise OrchError(
        f"no checkpoint in {checkpoint_dir} can be read back: "
        + "; ".join(f"{p.name}: {why}" for p, why in damaged)
        + ". Move the folder aside to start afresh"
    )


def _load(path: Path, device: torch.device, weights_only: bool) -> tuple[Any, str]:
    """``(record, "")``, or ``(None, why)`` when the file is missing or not a whole checkpoint.

    An error from a file whose archive is whole (every member passes its CRC) is no damage: it
    is raised (a weights-only refusal as an OrchError saying what to do), never skipped.
    """
    try:
        saved = torch.load(path, map_location=device, weights_only=weights_only)
    except FileNotFoundError:
        return None, "the file is missing"
    except Exception as e:
        why = _damage(path)
        if why:
            return None, why
        if isinstance(e, pickle.UnpicklingError) and weights_only:
            raise OrchError(
                f"{path} holds objects that a weights-only load refuses ({e}); if the file is your "
                "own and nobody else can write its folder, load it with "
                "ctx.load_checkpoint(weights_only=False)"
            ) from e
        raise
    if not isinstance(saved, dict) or type(saved.get("step")) is not int or "state" not in saved:
        return None, "it holds no checkpoint orch wrote (no step and state)"
    return saved, ""


def _damage(path: Path) -> str:
    """Why ``path`` is not a whole checkpoint archive ("" when it is)."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except FileNotFoundError:
        return "the file is missing"
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        return f"not a whole checkpoint archive (truncated or overwritten: {e})"
    return f"its {bad} fails the archive's CRC check (the bytes changed after it was written)" if bad else ""


def _fell_back(
    checkpoint_dir: Path,
    damaged: list[tuple[Path, str]],
    used: Path,
    step: int,
    listed: list[Checkpoint],
    mode: Mode,
    writer: bool,
) -> None:
    """Say which checkpoints were skipped and which one loaded; on rank 0, set them aside."""
    skipped = "; ".join(f"{p} is unreadable ({why})" for p, why in damaged)
    log.warning("checkpoint fallback: %s; resuming from %s (step %d) instead", skipped, used, step)
    if not writer:
        return
    with own_dir(checkpoint_dir) as folder:
        for path, _ in damaged:
            aside = path.name + ".corrupt"
            try:
                folder.move(path.name, aside)
            except FileNotFoundError:
                continue
            log.warning("checkpoint fallback: moved %s aside to %s", path, aside)
        gone = {p.name for p, _ in damaged}
        write_index(checkpoint_dir, [c for c in listed if c.name not in gone], mode)
        folder.put("latest", used.name.encode())
