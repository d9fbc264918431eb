"""Reading a run dir where others may write: only this user's folders, only regular files, capped.

A run root can be shared (``/tmp/runs``, a group's scratch folder), and anything another user
plants there is read by ``orch.runs()``, ``orch runs``, ``orch show``, ``orch logs``,
``load_run`` and a sweep's reuse of earlier runs. So a run dir is read only when this user
owns it (another user's is skipped in a listing and refused by name); a file in it is opened
without following a link and without blocking (a FIFO would hang the read, ``/dev/zero`` never
end it), and read only when it is a regular file this user owns; JSON files are read up to
MAX_JSON_BYTES and text lines up to MAX_LINE_BYTES.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from pathlib import Path
from typing import BinaryIO

from orch.errors import OrchError

MAX_JSON_BYTES = 16 * 1024 * 1024  # run.json, result.json, an error record
MAX_LINE_BYTES = 64 * 1024  # a line of a log or of the event log


def owner_name(uid: int) -> str:
    with contextlib.suppress(KeyError):
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    return f"uid {uid}"


def not_ours(st: os.stat_result) -> bool:
    return st.st_uid != os.geteuid()


def is_own_dir(path: str | Path) -> bool:
    """``path`` is a folder (not a link to one) that this user owns."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and not not_ours(st)


def check_own_dir(path: str | Path) -> None:
    """Raise an OrchError naming ``path`` and its owner unless it is a folder this user owns."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return  # a missing folder is the caller's own message
    if not stat.S_ISDIR(st.st_mode):
        raise OrchError(f"{path} is not a folder ({stat.filemode(st.st_mode)}): a run dir must be one")
    if not_ours(st):
        raise OrchError(
            f"{path} belongs to {owner_name(st.st_uid)}, not to you ({owner_name(os.geteuid())}): orch reads "
            "only run dirs of its own user, since anyone who can write to a shared run root can plant "
            "one; copy it to a folder of yours if you trust it"
        )


def open_own(path: str | Path) -> BinaryIO:
    """``path`` opened for reading when it is a regular file this user owns.

    FileNotFoundError passes through; a link, FIFO, device or another user's file is an
    OrchError that names it and its owner.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        if os.path.islink(path):
            raise OrchError(f"{path} is a link: orch reads only regular files in a run dir") from e
        raise OrchError(f"cannot read {path}: {e}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OrchError(
                f"{path} is not a regular file ({stat.filemode(st.st_mode)}): orch reads only regular "
                "files in a run dir; move it aside"
            )
        if not_ours(st):
            raise OrchError(
                f"{path} belongs to {owner_name(st.st_uid)}, not to you: orch reads only files of its "
                "own user in a run dir; move it aside"
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_own(path: str | Path, limit: int = MAX_JSON_BYTES) -> bytes:
    """The whole of ``path`` (see :func:`open_own`), refused past ``limit`` bytes."""
    with open_own(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OrchError(f"{path} is over {limit:,} bytes: not a file orch wrote; move it aside")
    return data


def read_line(f: BinaryIO, limit: int = MAX_LINE_BYTES) -> tuple[bytes, int]:
    """The next line of ``f`` (with its newline), at most ``limit`` bytes of it, and how many
    bytes of the line were skipped past the limit (0: it was whole)."""
    line = f.readline(limit)
    if len(line) < limit or line.endswith(b"\n"):
        return line, 0
    skipped = 0
    while True:
        rest = f.readline(limit)
        skipped += len(rest)
        if not rest or rest.endswith(b"\n"):
            return line + (b"\n" if rest.endswith(b"\n") else b""), skipped - rest.endswith(b"\n")
