"""Runs that outlive the kernel, by choice: ``orch.launch(..., detach=True)`` and ``orch.attach(run_dir)``.

A detached run is a :class:`~orch.launchers.run.Run` (its master, its forkserver and
workers) inside a small supervisor process, ``python -m orch.launchers.detached.supervisor``,
in a session of its own: the kernel that launched it can restart or die and the run goes
on; its workers watch the supervisor, not the kernel, so they still end when the supervisor
does. ::

    kernel: launch(detach=True)  ──stdin: the pickled spec──▶  supervisor (new session)
            ◀──status pipe: run id, then "serving" or the start-up error──  Run(spec).start()
                                                             writes runs/<id>/attach.json (0600)
    any later process: attach("runs/<id>") reads attach.json ──gRPC, with its token──▶ master

What the supervisor needs travels on a pipe from its parent, never through a file another
process could swap; the token travels in its environment, never on its command line. Its
stdout and stderr go to ``runs/<id>/supervisor.log`` (the kernel's pipes are not inherited).
Once its master serves, it writes ``attach.json``: the address, the token, the TLS CA and its
own pid and start time; it exits after the run ended and ``result.json`` was written, and
removes ``attach.json`` then. SIGTERM makes it end the run as ``Run.close()`` does.

This module is the launching side: :func:`start_detached` starts the supervisor and reads its
status pipe. The handle it returns is :mod:`orch.launchers.detached.run` (``DetachedRun``,
re-exported here), and ``attach.json``, which the supervisor writes and a later ``attach``
reads, is :mod:`orch.launchers.attach_file`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import pickle
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from orch.errors import ConfigError, OrchError
from orch.launchers.attach_file import LOG_FILE
from orch.launchers.detached.run import DetachedRun
from orch.launchers.spec import LaunchSpec
from orch.runtime.source import capture
from orch.wire.auth import TOKEN_ENV, new_token, token_from_env

START_TIMEOUT = 120.0  # the supervisor imports grpc and starts a master: seconds on a loaded machine


def start_detached(spec: LaunchSpec, *, start_timeout: float = START_TIMEOUT) -> DetachedRun:
    """Start ``spec`` under a supervisor in a new session; return once its master serves.

    A start-up error in the supervisor is raised here: a :class:`ConfigError` as ``launch``
    raises it (a port taken), anything else an :class:`OrchError` with the supervisor's log tail.
    """
    token = token_from_env(spec.token) or new_token()
    sent = copy.copy(spec)
    sent.token = None  # the token goes in the environment, the spec down a pipe: neither on argv
    payload = job_of(sent)
    status_r, status_w = os.pipe()
    # The supervisor's output before its run dir exists: an unlinked file, not the kernel's pipes.
    early = tempfile.TemporaryFile()  # noqa: SIM115 (closed below)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orch.launchers.detached.supervisor", "--status-fd", str(status_w)],
            stdin=subprocess.PIPE,
            stdout=early,
            stderr=subprocess.STDOUT,
            pass_fds=(status_w,),
            start_new_session=True,  # not in the kernel's process group: its signals stay there
            env={**os.environ, TOKEN_ENV: token},
            cwd=os.getcwd(),
        )
    except BaseException:
        os.close(status_r)
        early.close()
        raise
    finally:
        os.close(status_w)
    # Reaps the supervisor when it ends, so this process never holds a zombie of it.
    threading.Thread(target=proc.wait, name="orch-detach-reaper", daemon=True).start()
    with early, open(status_r, "rb", buffering=0) as status:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # it died at once: its status says why
            proc.stdin.write(payload)
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        try:
            messages, timed_out = _read_status(status, time.monotonic() + start_timeout)
        except BaseException:  # Ctrl-C while it starts: no run goes on that nobody knows of
            _end_process(proc)
            raise
        started = _merge(messages)
        run_dir = Path(spec.run_root) / str(started["run_id"]) if "run_id" in started else None
        if started.get("ready") and run_dir is not None:
            try:
                return DetachedRun(run_dir, supervisor=proc)
            except BaseException:
                _end_process(proc)  # serving, yet unreachable from here: not left running unseen
                raise
        if timed_out:
            _end_process(proc)
        raise _start_error(started, proc, run_dir, early, timed_out, start_timeout)


def job_of(spec: LaunchSpec) -> bytes:
    """What a process that runs ``spec`` for this one reads from it, down a pipe: the spec (a
    function defined in a cell pickled by value), this process's ``sys.path`` and its sources."""
    import cloudpickle

    job = {
        "sys_path": list(sys.path),  # a function pickled by reference imports as it does here
        "spec": cloudpickle.dumps(spec),
        "sources": capture(spec.fn),  # notebook cells' source lines live only in this process's linecache
    }
    return pickle.dumps(job)


def _read_status(status: IO[bytes], deadline: float) -> tuple[list[dict[str, Any]], bool]:
    """The supervisor's status messages (JSON lines) until it says ready or failed, or the pipe ends."""
    buffer = b""
    messages: list[dict[str, Any]] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return messages, True
        readable, _, _ = select.select([status], [], [], min(left, 1.0))
        if not readable:
            continue
        chunk = status.read(65536)
        if not chunk:
            return messages, False
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError):
                message = json.loads(line)
                if isinstance(message, dict):
                    messages.append(message)
                    if message.get("ready") or "error" in message:
                        return messages, False


def _merge(messages: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for m in messages:
        merged.update(m)
    return merged


def _start_error(
    started: dict[str, Any],
    proc: subprocess.Popen[bytes],
    run_dir: Path | None,
    early: IO[bytes],
    timed_out: bool,
    start_timeout: float,
) -> OrchError:
    error = str(started.get("error", ""))
    if error and started.get("config"):
        return ConfigError(error)  # a bad port or the like: the message says what to pass instead
    log_path = run_dir / LOG_FILE if run_dir is not None else None
    text = _tail_text(log_path) if log_path is not None else ""
    if not text:
        early.flush()
        text = os.pread(early.fileno(), 64 * 1024, 0).decode("utf-8", "replace")
        log_path = None
    tail = "\n".join(text.rstrip().splitlines()[-30:])
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5.0)
    if timed_out:
        what = f"did not start serving within {start_timeout:g}s and was ended"
    elif error:
        what = f"failed to start: {error}"
    else:
        what = f"exited (code {proc.returncode}) before its master served"
    where = f" (its log: {log_path})" if log_path is not None else ""
    return OrchError(f"the detached run's supervisor {what}{where}\n--- its last lines ---\n{tail}")


def _tail_text(path: Path, max_bytes: int = 64 * 1024) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - max_bytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _end_process(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(5.0)
