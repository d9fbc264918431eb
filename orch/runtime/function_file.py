"""The training function's way to a Slurm job's nodes: a file in the run dir, signed.

The launching process writes ``function.pkl`` (0600) on the shared file system; each node's
``orch worker --fn-file`` reads it. The file carries an HMAC-SHA256 of its pickle, keyed by
the run's token, and nothing is unpickled before that signature matched: a file someone else
changed, or one read with another run's token, is refused. Kept apart from the job (the
launching side) since the worker's side, :func:`read_function`, needs none of it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
from pathlib import Path
from typing import Any

from orch.errors import WorkerError

FUNCTION_FILE = "function.pkl"
SIGNATURE = b"orch-function-v1\n"  # what a function file starts with, then its HMAC, then the pickle


def write_function(run_dir: Path, fn: Any, sources: Any, token: str) -> Path:
    """Write the training function (and where its code came from) for the nodes: 0600, signed
    with the run's token. Returns its path."""
    import cloudpickle

    payload = cloudpickle.dumps({"fn": fn, "sources": sources})
    digest = hmac.new(token.encode(), payload, hashlib.sha256).digest()
    path = run_dir / FUNCTION_FILE
    tmp = path.with_suffix(".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # a leftover (or someone's link): never written through
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(SIGNATURE + digest + payload)
    os.replace(tmp, path)
    return path


def read_function(path: str | Path, token: str | None) -> tuple[Any, Any]:
    """The function and sources of a function file, once its signature matched ``token``.

    Nothing is unpickled before that: a file changed by someone else, or read with another
    run's token, is refused with a WorkerError that says which.
    """
    if not token:
        raise WorkerError(f"--fn-file {path}: the run's token is needed to check it (set ORCH_TOKEN)")
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise WorkerError(
            f"--fn-file {path}: cannot read it: {e} (is the run dir on a shared file system?)"
        ) from e
    head = len(SIGNATURE)
    if not data.startswith(SIGNATURE) or len(data) < head + 32:
        raise WorkerError(f"--fn-file {path} is not an orch function file (or it was cut short)")
    digest, payload = data[head : head + 32], data[head + 32 :]
    if not hmac.compare_digest(digest, hmac.new(token.encode(), payload, hashlib.sha256).digest()):
        raise WorkerError(
            f"--fn-file {path} does not carry this run's signature: it was changed after the launch, "
            "or this worker has another run's token; refusing to load it"
        )
    import cloudpickle

    loaded = cloudpickle.loads(payload)
    return loaded["fn"], loaded["sources"]
