"""The training function's way to a Slurm job's nodes: a file in the run dir, signed.

The launching process writes ``function.pkl`` (0600) on the shared file system; each node's
``orch worker --fn-file`` reads it. The file carries an HMAC-SHA256 of its run id and its
pickle, keyed by the run's token, and nothing is unpickled before that signature matched: a
file someone else changed, one read with another run's token, or another run's file (signed
with the same token) dropped into this run's dir, is refused. The run a file belongs to is the
folder that holds it: a run dir is named by its run id. Kept apart from the job (the
launching side) since the worker's side, :func:`read_function`, needs none of it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from pathlib import Path
from typing import Any

from orch.errors import WorkerError
from orch.record.writes import own_dir

FUNCTION_FILE = "function.pkl"
SIGNATURE = b"orch-function-v2\n"  # what a function file starts with, then its HMAC, then the pickle
MAX_FUNCTION_BYTES = 1 << 30  # a function file is read whole: past this it is refused unread


def _digest(token: str, run_id: str, payload: bytes) -> bytes:
    """The signature: the run id (a plain name, never holding a NUL) then the pickle."""
    return hmac.new(token.encode(), run_id.encode() + b"\0" + payload, hashlib.sha256).digest()


def write_function(run_dir: Path, fn: Any, sources: Any, token: str) -> Path:
    """Write the training function (and where its code came from) for the nodes: 0600, signed
    with the run's token over the run id (``run_dir``'s name) and the pickle. Returns its path."""
    import cloudpickle

    payload = cloudpickle.dumps({"fn": fn, "sources": sources})
    digest = _digest(token, run_dir.name, payload)
    with own_dir(run_dir) as folder:
        folder.put(FUNCTION_FILE, SIGNATURE + digest + payload)
    return run_dir / FUNCTION_FILE


def read_function(path: str | Path, token: str | None) -> tuple[Any, Any]:
    """The function and sources of a function file, once its signature matched ``token`` and
    the run id its folder is named by.

    Nothing is unpickled before that: a file changed by someone else, read with another run's
    token, or signed for another run, is refused with a WorkerError that says which.
    """
    if not token:
        raise WorkerError(f"--fn-file {path}: the run's token is needed to check it (set ORCH_TOKEN)")
    run_id = Path(os.path.abspath(path)).parent.name
    try:
        data = _read_regular(Path(path))
    except OSError as e:
        raise WorkerError(
            f"--fn-file {path}: cannot read it: {e} (is the run dir on a shared file system?)"
        ) from e
    head = len(SIGNATURE)
    if not data.startswith(SIGNATURE) or len(data) < head + 32:
        raise WorkerError(f"--fn-file {path} is not an orch function file (or it was cut short)")
    digest, payload = data[head : head + 32], data[head + 32 :]
    if not hmac.compare_digest(digest, _digest(token, run_id, payload)):
        raise WorkerError(
            f"--fn-file {path} does not carry the signature of run {run_id}: it was changed after "
            "the launch, it was written for another run, or this worker has another run's token; "
            "refusing to load it"
        )
    import cloudpickle

    loaded = cloudpickle.loads(payload)
    return loaded["fn"], loaded["sources"]


def _read_regular(path: Path) -> bytes:
    """The bytes of ``path``, a regular file (a FIFO would hang the read, a device never end it)
    of at most MAX_FUNCTION_BYTES; anything else is an OSError that says what it is."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"not a regular file (mode {stat.filemode(st.st_mode)})")
        if st.st_size > MAX_FUNCTION_BYTES:
            raise OSError(f"{st.st_size} bytes, over the {MAX_FUNCTION_BYTES}-byte limit")
        return f.read(MAX_FUNCTION_BYTES + 1)
