"""A live run's ``attach.json``: where its master serves, read by whoever attaches later.

Every run of this machine's launch writes it, 0600 in its 0700 run dir, once its master serves,
and removes it when the master stops (:class:`orch.Run`; a detached run's supervisor is the run's
process); :func:`read_attach_file` reads it for ``orch.attach(RUN_ID)``, ``orch status RUN_ID``
and ``orch stacks RUN_ID``.
It holds the run's token, so it is trusted only when it is a regular file of this user's that
no other user can read. Its neighbour in the run dir, ``supervisor.log``, is named here too.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orch.errors import ConfigError, OrchError
from orch.record.store import json_object

ATTACH_FILE = "attach.json"
LOG_FILE = "supervisor.log"
MAX_ATTACH_BYTES = 64 * 1024


@dataclass(frozen=True)
class Endpoint:
    """What ``attach.json`` says: where the run's master serves and which process answers for it."""

    run_id: str
    address: str
    token: str
    tls_ca: str | None
    tls_server_name: str | None
    pid: int
    start_time: int | None
    host: str
    # "supervisor": a detached run's own process, which close() may end; "launcher": the process
    # that launched the run (a notebook kernel, `orch run`), which another process never signals.
    kind: str = "supervisor"


def read_attach_file(run_dir: Path) -> Endpoint | None:
    """``run_dir/attach.json``, or None when there is none; refused unless it is this user's alone.

    It holds the run's token: a file another user could read (or write, or swap for a link) is
    not trusted, and the error says so.
    """
    path = run_dir / ATTACH_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ConfigError(f"{path} is a symbolic link: orch reads a run's token only from a file") from e
        raise OrchError(f"cannot read {path}: {e}") from e
    with open(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path} is not a regular file: orch reads a run's token only from a file")
        if st.st_uid != os.getuid():
            raise ConfigError(
                f"{path} belongs to user id {st.st_uid}, not to you ({os.getuid()}): orch does not "
                "trust the address and token in it. Attach from that user's account."
            )
        if st.st_mode & 0o077:
            raise ConfigError(
                f"{path} can be read by other users (mode {stat.S_IMODE(st.st_mode):04o}): the run's "
                "token in it may have leaked, so orch refuses it. If you trust it, `chmod 600` it and "
                "attach again; otherwise end the run (its supervisor's pid is in the file)."
            )
        data = f.read(MAX_ATTACH_BYTES + 1)
    if len(data) > MAX_ATTACH_BYTES:
        raise OrchError(f"{path} is larger than {MAX_ATTACH_BYTES} bytes: not an orch attach file")
    value = json_object(
        data, str(path), "it is damaged: attach by address, orch.attach('HOST:PORT', token=...)"
    )
    try:
        return Endpoint(
            run_id=_field(value, "run_id", str),
            address=_field(value, "address", str),
            token=_field(value, "token", str),
            tls_ca=_field(value, "tls_ca", str, optional=True),
            tls_server_name=_field(value, "tls_server_name", str, optional=True),
            pid=_field(value, "pid", int),
            start_time=_field(value, "start_time", int, optional=True),
            host=_field(value, "host", str),
            kind=_field(value, "kind", str, optional=True) or "supervisor",
        )
    except (KeyError, TypeError) as e:
        raise OrchError(f"{path}: {e}: not an orch attach file") from e


def _field(value: dict[str, Any], key: str, kind: type, *, optional: bool = False) -> Any:
    v = value[key] if not optional else value.get(key)
    if v is None and optional:
        return None
    if not isinstance(v, kind) or isinstance(v, bool):
        raise TypeError(f"{key!r} should be {kind.__name__}, not {type(v).__name__}")
    return v
