"""The one place a name a user typed becomes a run dir.

A name is a run dir's path, a run id under the run root, or the unique start of one
(``orch show 2026``). :func:`run_dir_named` is used by the CLI's ``orch show``/``orch logs``,
by :func:`orch.attach` and by :func:`~orch.launchers.attached.open_run` (the panels and
``orch status``), so a name means the same run everywhere; :func:`no_run` is what each says
when it names none.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from orch.errors import ConfigError, OrchError
from orch.record.owned import is_own_dir, read_own

RUN_FILES = ("run.json", "result.json", "metrics.pb")  # a folder with one of these is a run dir


def is_run_dir(path: str | Path) -> bool:
    """Whether ``path`` is a folder holding a run (one of :data:`RUN_FILES`)."""
    return any((Path(path) / f).exists() for f in RUN_FILES)


def started(path: Path) -> float:
    """When the run in ``path`` started (``run.json``), else when its folder last changed: the
    order ``orch runs`` lists runs in, newest first."""
    with contextlib.suppress(OSError, OrchError, ValueError):
        meta = json.loads(read_own(path / "run.json"))
        value = meta.get("started") if isinstance(meta, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value:
            return float(value)
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _is_id(text: str) -> bool:
    return bool(text) and "/" not in text and os.sep not in text and text not in (".", "..")


def run_dir_named(target: str | os.PathLike[str], run_root: str | Path = "runs") -> Path | None:
    """The run dir ``target`` names, or None when it names none (it may be a master's address).

    A folder that holds no run, or the start of several run ids, is a :class:`ConfigError`
    that says so. Folders another user owns are never matched by a start of an id."""
    path, root, text = Path(target), Path(run_root), os.fspath(target)
    if path.is_dir() and is_run_dir(path):
        return path
    if _is_id(text):
        if (root / text).is_dir():
            return root / text
        with contextlib.suppress(OSError):
            matches = sorted(
                e.name for e in os.scandir(root) if e.name.startswith(text) and is_own_dir(e.path)
            )
            if len(matches) == 1:
                return root / matches[0]
            if matches:
                raise ConfigError(
                    f"{text!r} starts {len(matches)} run ids under {root}/ ({', '.join(matches[:5])}"
                    f"{', ...' if len(matches) > 5 else ''}): pass more of the id"
                )
    if path.is_dir():
        raise ConfigError(f"{path} is not an orch run dir (it has no {', '.join(RUN_FILES)})")
    return None


def no_run(text: str, run_root: str | Path = "runs", *, address: bool = False) -> ConfigError:
    """The error for a name that names no run: what is under ``run_root``, newest first, and
    (``address``: where a master's HOST:PORT was taken too) how to name a master."""
    root = Path(run_root)
    newest: list[tuple[float, str]] = []
    with contextlib.suppress(OSError):
        for e in os.scandir(root):
            if is_own_dir(e.path) and is_run_dir(e.path):
                newest.append((started(Path(e.path)), e.name))
    names = [name for _, name in sorted(newest, reverse=True)[:5]]
    nor = ", nor a master's HOST:PORT" if address else ""
    if not names:
        return ConfigError(
            f"no run {text!r}: not a run dir{nor}, and {root}/ holds no runs: pass a run dir's "
            "path, or the run root that holds it"
        )
    return ConfigError(
        f"no run {text!r}: not a run dir, nor a run id under {root}/{nor}; the newest there: "
        f"{', '.join(names)} (`orch runs` lists them all)"
    )
