"""Writing in a run root where others may write: the one way orch puts anything there.

A run root can be shared (``/tmp/runs``, a group's scratch folder), so what another user
plants in it must never redirect a write: a link where a file or folder is expected, a folder
of theirs where orch's should be, a folder swapped in behind a run's back. :mod:`.owned` keeps
the reads safe; this module keeps the writes safe, as OpenSSH's ``StrictModes`` keeps the
files it trusts:

- A folder orch writes in (:func:`own_dir`) is made 0700 and opened without following a link
  (``O_DIRECTORY | O_NOFOLLOW``); its owner and mode are checked on the open descriptor: it is
  this user's, and nobody else may write in it. Every folder above it is checked as it is
  walked: each is this user's or root's, and none lets others write in it without the sticky
  bit (in such a folder another user could rename what is below and put theirs in its place).
  A link on the way is followed only when it is this user's or root's, never a stranger's.
  Anything else is refused with an :class:`UnsafePath` naming it and what to do.
- A file is created ``O_CREAT | O_EXCL | O_NOFOLLOW`` at 0600 under a fresh random name, in
  the folder it belongs to, through that folder's descriptor, then renamed into place: a
  ``.tmp`` name someone planted is never opened. An appended file (a log, the metrics log) is
  opened ``O_NOFOLLOW`` and must be a regular file of this user's.
- Only orch's own files are removed: by their exact name, and only regular files.
- In a shared run root, a user's sweeps and gangs live in a folder of their own
  (:func:`user_dir`): a name another user took first is passed over, never followed, so
  what one user plants blocks no other (:mod:`.user_folders` says which folder is whose).

A checked folder is held open (:class:`OwnDir`): the run's writes go through its descriptor,
so they stay in it even if its path were changed afterwards; :meth:`OwnDir.moved` says when
the path no longer leads to it (the run then fails with that cause).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import grp
import json
import logging
import os
import pwd
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from orch.errors import OrchError
from orch.record.owned import owner_name

log = logging.getLogger(__name__)

MAX_LINKS = 40  # links followed in one walk, as the kernel allows


class UnsafePath(OrchError):
    """A folder or file orch would write through is not safe to write through."""


def _trusted_owner(st: os.stat_result) -> bool:
    return st.st_uid in (os.geteuid(), 0)


def _group_may_move(st: os.stat_result) -> bool:
    """The folder's group may rename or remove what is in it (it may write, no sticky bit), and
    the group is not this user's own (a user private group, as Debian and Ubuntu make one for
    each user, and their umask 002 makes every new folder group-writable)."""
    risky = st.st_mode & stat.S_IWGRP and not st.st_mode & stat.S_ISVTX
    return bool(risky) and not _private_group(st.st_gid)


@functools.lru_cache(maxsize=64)
def _private_group(gid: int) -> bool:
    """No user but this one is in group ``gid``, as a member or by their primary group."""
    me = os.geteuid()
    try:
        members = grp.getgrgid(gid).gr_mem
        name = pwd.getpwuid(me).pw_name
    except KeyError:
        return False
    if any(m != name for m in members):
        return False
    return all(p.pw_gid != gid or p.pw_uid == me for p in pwd.getpwall())


def _group_name(gid: int) -> str:
    with contextlib.suppress(KeyError):
        return grp.getgrgid(gid).gr_name
    return f"gid {gid}"


_told: set[str] = set()  # the folders warned of (once each)


def _warn_once(key: str, text: str) -> None:
    if key not in _told:
        _told.add(key)
        log.warning("%s", text)


def _walk(path: Path) -> os.stat_result:
    """Check every folder and link on the way to ``path`` (which must exist); its lstat."""
    parts = list(Path(os.path.abspath(path)).parts[1:])
    at = Path("/")
    links = 0
    st = os.lstat(at)
    while parts:
        name = parts.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            at = at.parent
            continue
        here = at / name
        st = os.lstat(here)
        if stat.S_ISLNK(st.st_mode):
            if not _trusted_owner(st):
                raise UnsafePath(
                    f"{here} is a link of {owner_name(st.st_uid)}'s: orch follows no link another user "
                    "made on the way to where it writes; remove it, or use a run root of your own"
                )
            links += 1
            if links > MAX_LINKS:
                raise UnsafePath(f"{path}: too many links on the way (more than {MAX_LINKS})")
            target = Path(os.readlink(here))
            parts = list(target.parts[1:] if target.is_absolute() else target.parts) + parts
            if target.is_absolute():
                at = Path("/")
            continue
        if stat.S_ISDIR(st.st_mode):
            if not _trusted_owner(st):
                # A project folder of an admin's, say: its owner could move what is below it,
                # as root could. Said once; the checks below still hold for the rest.
                _warn_once(
                    str(here),
                    f"{here} belongs to {owner_name(st.st_uid)}, who could rename folders orch makes "
                    "below it; orch writes there all the same, through folders it holds open",
                )
            if _group_may_move(st):
                _warn_once(
                    str(here),
                    f"{here} lets its group ({_group_name(st.st_gid)}) write in it without the sticky bit: "
                    "a member could rename a run's folder below it and put theirs in its place; orch "
                    "writes through the folders it holds open, and a run whose dir was swapped fails "
                    f"saying so; make it sticky (chmod +t {here}) to close this",
                )
            if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
                raise UnsafePath(
                    f"{here} lets every user write in it (mode {stat.filemode(st.st_mode)}) without the "
                    "sticky bit, so another user could rename a run's folder below it and put theirs "
                    f"in its place: make it sticky (chmod +t {here}), as /tmp is, or take their write "
                    "away (chmod o-w), or use another run root"
                )
        at = here
    return st


def _check_own(fd: int, path: Path) -> None:
    """The folder open at ``fd`` is this user's and nobody else may write in it."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise UnsafePath(
            f"{path} belongs to {owner_name(st.st_uid)}, not to you ({owner_name(os.geteuid())}): orch "
            "did not make it, and writes nothing in a folder of someone else's; move it aside or use "
            "another run root"
        )
    if st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and not _private_group(st.st_gid)):
        raise UnsafePath(
            f"{path} lets others write in it (mode {stat.filemode(st.st_mode)}): orch makes its "
            f"folders 0700; take their write away (chmod go-w {path}) or move it aside"
        )


class OwnDir:
    """A folder of this user's that nobody else may write in, held open: writes go through its
    descriptor (``dir_fd``), never through its path again."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path
        st = os.fstat(fd)
        self._identity = (st.st_dev, st.st_ino)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> OwnDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def moved(self) -> str:
        """ "" while ``self.path`` still leads to this folder; else what is there now."""
        try:
            st = os.lstat(self.path)
        except OSError as e:
            return f"{self.path} is gone ({e.strerror})"
        if (st.st_dev, st.st_ino) == self._identity:
            return ""
        return (
            f"{self.path} is no longer the folder orch made for it: it was renamed and replaced by "
            f"another ({stat.filemode(st.st_mode)}, {owner_name(st.st_uid)})"
        )

    def proc_path(self, name: str = "") -> str:
        """A path that reaches ``name`` in this folder through its descriptor, for a library
        that takes only paths (torch's FileStore, SQLite): ``/proc/self/fd/<fd>/<name>``."""
        base = f"/proc/self/fd/{self.fd}"
        return f"{base}/{name}" if name else base

    def sub(self, name: str) -> OwnDir:
        """The folder ``name`` in this one, made 0700 where it is not there yet."""
        _plain(name)
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=self.fd)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        except OSError as e:
            raise _refused(self.path / name, e) from e
        try:
            _check_own(fd, self.path / name)
        except BaseException:
            os.close(fd)
            raise
        return OwnDir(fd, self.path / name)

    def put(self, name: str, data: bytes, *, sync: bool = True) -> None:
        """``name`` holds ``data``, whole or not at all: a fresh 0600 file renamed into place."""
        with self.atomic(name, sync=sync) as f:
            f.write(data)

    def put_json(self, name: str, value: Any) -> None:
        self.put(name, json.dumps(value).encode())

    @contextlib.contextmanager
    def atomic(self, name: str, *, sync: bool = True) -> Iterator[IO[bytes]]:
        """A new file to write, that becomes ``name`` once the block ends without an error."""
        _plain(name)
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=self.fd)  # fmt: skip
        try:
            with os.fdopen(fd, "wb") as f:
                yield f
                if not f.closed:  # a text wrapper around it closes it with itself
                    f.flush()
                    if sync:
                        os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise

    def append(self, name: str) -> IO[bytes]:
        """``name`` opened to append (made 0600 where it is not there): a regular file of yours."""
        return os.fdopen(self.append_fd(name), "ab", buffering=0)

    def append_fd(self, name: str) -> int:
        """As :meth:`append`, the descriptor itself (for a child's stdout and stderr)."""
        _plain(name)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(name, flags, 0o600, dir_fd=self.fd)
        except OSError as e:
            raise _refused(self.path / name, e) from e
        try:
            _check_file(fd, self.path / name)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def remove(self, name: str) -> bool:
        """Remove ``name`` if it is a regular file (never a folder or a link's target); True if gone."""
        _plain(name)
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return True
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)  # a link itself goes, never what it points at
        return True

    def remove_empty(self, name: str) -> bool:
        """Remove the folder ``name`` if it is empty (never a link, never what is in it); True if gone."""
        _plain(name)
        try:
            os.rmdir(name, dir_fd=self.fd)
        except FileNotFoundError:
            return True
        except OSError:  # not empty, not a folder (a link to one included)
            return False
        return True

    def move(self, name: str, new: str) -> None:
        _plain(name)
        _plain(new)
        os.replace(name, new, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def names(self) -> list[str]:
        return os.listdir(self.fd)

    def is_file(self, name: str) -> bool:
        """``name`` is a regular file here (not a link, folder or device)."""
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode)


def _plain(name: str) -> None:
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ValueError(f"{name!r} is not a plain file name")


def _check_file(fd: int, path: Path) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(f"{path} is not a regular file ({stat.filemode(st.st_mode)}): move it aside")
    if st.st_uid != os.geteuid():
        raise UnsafePath(
            f"{path} belongs to {owner_name(st.st_uid)}, not to you: orch did not write it and will not "
            "use it; move it aside"
        )


def _refused(path: Path, e: OSError) -> UnsafePath:
    if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK) or os.path.islink(path):
        whose = ""
        with contextlib.suppress(OSError):
            whose = f" of {owner_name(os.lstat(path).st_uid)}'s"
        return UnsafePath(
            f"{path} is a link{whose}: orch writes through no link in a run root; move it aside"
        )
    return UnsafePath(f"cannot use {path}: {e.strerror or e}")


def own_dir(path: str | Path) -> OwnDir:
    """The folder ``path``, made 0700 where it is missing (its missing parents with the usual
    mode, as ``mkdir -p``), checked as the module docstring says, held open."""
    path = Path(os.path.abspath(path))
    parent = path.parent
    if not parent.exists():
        # Checked before anything is made in it: a root others could move things in stays as it was.
        _walk(next(p for p in parent.parents if p.exists()))
        parent.mkdir(parents=True, exist_ok=True)
    _walk(parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise _refused(path, e) from e
    try:
        _check_own(fd, path)
        walked = os.lstat(path)
        if (walked.st_dev, walked.st_ino) != (os.fstat(fd).st_dev, os.fstat(fd).st_ino):
            raise UnsafePath(f"{path} changed while orch opened it: another user is at work in its run root")
    except BaseException:
        os.close(fd)
        raise
    return OwnDir(fd, path)


def private_dir(path: Path) -> Path:
    """Make the folder ``path`` for this user alone (0700), checked as :func:`own_dir` checks
    it (no link, no folder of someone else's, nothing above it others could move); folders
    above it get the usual mode. A run dir holds tracebacks, logs and checkpoints: other
    users of the host have no business reading them."""
    own_dir(path).close()
    return path


def others_may_write(path: str | Path) -> bool:
    """Users other than this one may make names in the folder ``path`` (it is another user's,
    every user may write in it, sticky or not, or a group beyond this user's own may): a shared
    run root. False where it is not there yet (orch makes it, the user's own)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    group = st.st_mode & stat.S_IWGRP and not _private_group(st.st_gid)
    return st.st_uid != os.geteuid() or bool(st.st_mode & stat.S_IWOTH or group)


def user_dir(root: str | Path, base: str) -> OwnDir:
    """This user's own folder ``base`` in the shared folder ``root``, made 0700 where it is not
    there yet, checked and held open as :func:`own_dir` holds one; ``root`` is walked as
    :func:`own_dir` walks a folder's parent.

    In a folder others may write in, another user can take a name first. Their folder or link
    named ``base`` is passed over, never opened, and a folder ``<base>.<random>`` is made beside
    it instead; it is found again later, as this user's folder is ``base`` where that is theirs,
    else the first by name of their folders ``<base>.*`` (a link, or another user's folder, by
    any of these names is never one: it is looked at without following it)."""
    _plain(base)
    root = Path(os.path.abspath(root))
    _walk(root)
    with OwnDir(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), root) as where:
        held, there = os.fstat(where.fd), os.stat(root)  # root may be a link of the user's: followed
        if (held.st_dev, held.st_ino) != (there.st_dev, there.st_ino):
            raise UnsafePath(f"{root} changed while orch opened it: another user is at work in it")
        name = _user_dir_name(where, base)
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, dir_fd=where.fd)
        except OSError as e:
            raise _refused(root / name, e) from e
    try:
        _check_own(fd, root / name)
    except BaseException:
        os.close(fd)
        raise
    return OwnDir(fd, root / name)


def _user_dir_name(root: OwnDir, base: str) -> str:
    """The name of this user's folder ``base`` in ``root`` (see :func:`user_dir`), made if none is."""

    def mine(name: str) -> bool:
        try:
            st = os.stat(name, dir_fd=root.fd, follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()

    def found() -> str | None:
        if mine(base):
            return base
        spare = sorted(n for n in root.names() if n.startswith(f"{base}.") and mine(n))
        return spare[0] if spare else None

    name = found()
    if name is not None:
        return name
    made = base
    try:
        os.mkdir(base, 0o700, dir_fd=root.fd)
    except FileExistsError:
        made = f"{base}.{secrets.token_hex(6)}"
        os.mkdir(made, 0o700, dir_fd=root.fd)
        with contextlib.suppress(OSError):
            taken = os.stat(base, dir_fd=root.fd, follow_symlinks=False)
            kind = "a link" if stat.S_ISLNK(taken.st_mode) else f"a {stat.filemode(taken.st_mode)}"
            _warn_once(
                str(root.path / base),
                f"{root.path / base} is {kind} of {owner_name(taken.st_uid)}'s, not a folder of yours: "
                f"orch neither follows nor writes through it, and keeps your folders in {root.path / made}",
            )
    name = found() or made  # two of this user's processes that each made one settle on the first
    if name != made:
        root.remove_empty(made)
    return name


def check_dir(path: str | Path) -> None:
    """Refuse now what :func:`own_dir` would refuse for ``path``, making nothing: the folder
    where it is there, else the folders above it that are."""
    path = Path(os.path.abspath(path))
    if os.path.lexists(path):
        own_dir(path).close()  # there already: nothing is made
    else:
        _walk(next(p for p in path.parents if os.path.lexists(p)))


def own_file(path: str | Path) -> Path:
    """``path``, a file orch keeps in a folder of its own (an SQLite study): its folder is made
    and checked as :func:`own_dir` does, and the file, where it is there, must be a regular
    file of this user's. Returns the path, never resolved through a link."""
    path = Path(os.path.abspath(path))
    with own_dir(path.parent) as folder:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(path.name, flags, dir_fd=folder.fd)
        except FileNotFoundError:
            return path
        except OSError as e:
            raise _refused(path, e) from e
        try:
            _check_file(fd, path)
        finally:
            os.close(fd)
    return path


def write_json(path: str | Path, value: Any) -> None:
    """``path`` holds ``value`` as JSON, whole or not at all (see :meth:`OwnDir.atomic`)."""
    path = Path(path)
    with own_dir(path.parent) as folder:
        folder.put_json(path.name, value)


@contextlib.contextmanager
def export_file(path: str | Path) -> Iterator[IO[bytes]]:
    """A file of an export to a place the user named (a CSV, a store): written under a fresh
    0600 name beside ``path``, then renamed onto it, so a link planted at ``path`` is replaced,
    never written through. The folder is the user's choice and is not checked as a run root is."""
    path = Path(os.path.abspath(path))
    _plain(path.name)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # closed with the OwnDir
    with OwnDir(fd, path.parent) as folder, folder.atomic(path.name, sync=False) as f:
        yield f


def private_store(path: str | Path) -> None:
    """An empty 0600 file at ``path`` unless one is there (a store a library opens by path and
    would create with the usual mode, readable by everyone): never through a link."""
    path = Path(os.path.abspath(path))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        os.close(os.open(path, flags, 0o600))
    except FileExistsError:
        if os.path.islink(path):
            raise UnsafePath(f"{path} is a link: orch opens no store through one; move it aside") from None
