"""Runs that outlive the kernel, by choice: ``orch.launch(..., detach=True)`` and ``orch.attach(run_dir)``.

A detached run is a :class:`~orch.launchers.run.Run` (its master, its forkserver and workers) inside a
small supervisor process, ``python -m orch.launchers._supervisor``, in a session of its own: the kernel that
launched it can restart or die and the run goes on; its workers watch the supervisor, not the
kernel, so they still end when the supervisor does. ::

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
"""

from __future__ import annotations

import contextlib
import copy
import errno
import json
import logging
import os
import pickle
import select
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from orch.errors import ConfigError, MasterUnavailable, OrchError
from orch.launchers.contract import RunHandle, RunResult, failure_of, still_running
from orch.launchers.loaded import load_run
from orch.launchers.spec import LaunchSpec
from orch.record.store import json_object
from orch.runtime._owner import process_alive
from orch.runtime._source import capture
from orch.wire.auth import TOKEN_ENV, new_token, token_from_env
from orch.wire.client import MasterClient, StateMirror
from orch.wire.states import RunState

log = logging.getLogger(__name__)

ATTACH_FILE = "attach.json"
LOG_FILE = "supervisor.log"
START_TIMEOUT = 120.0  # the supervisor imports grpc and starts a master: seconds on a loaded machine
CLOSE_TIMEOUT = 90.0  # Run.close() in the supervisor: the monitor's join, the workers' grace, the master
MAX_ATTACH_BYTES = 64 * 1024
EXIT_CODES = {RunState.SUCCEEDED: 0, RunState.FAILED: 1, RunState.STOPPED: 3}


# -- the launching side ----------------------------------------------------------------------
def start_detached(spec: LaunchSpec, *, start_timeout: float = START_TIMEOUT) -> DetachedRun:
    """Start ``spec`` under a supervisor in a new session; return once its master serves.

    A start-up error in the supervisor is raised here: a :class:`ConfigError` as ``launch``
    raises it (a port taken), anything else an :class:`OrchError` with the supervisor's log tail.
    """
    import cloudpickle

    token = token_from_env(spec.token) or new_token()
    sent = copy.copy(spec)
    sent.token = None  # the token goes in the environment, the spec down a pipe: neither on argv
    job = {
        "sys_path": list(sys.path),  # a function pickled by reference imports as it does here
        "spec": cloudpickle.dumps(sent),
        "sources": _capture_sources(spec),
    }
    payload = pickle.dumps(job)
    status_r, status_w = os.pipe()
    # The supervisor's output before its run dir exists: an unlinked file, not the kernel's pipes.
    early = tempfile.TemporaryFile()  # noqa: SIM115 (closed below)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orch.launchers._supervisor", "--status-fd", str(status_w)],
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


def _capture_sources(spec: LaunchSpec) -> Any:
    return capture(spec.fn)  # notebook cells' source lines live only in this process's linecache


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


# -- attach.json -------------------------------------------------------------------------------
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


def _signal_process(pid: int, start_time: int | None, sig: signal.Signals) -> bool:
    """Send ``sig`` to ``pid`` if it is still the process that started at ``start_time``."""
    pidfd = -1
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(pid)
    try:
        # Checked after the pidfd was opened: the pidfd names that process, however pids get reused.
        if not process_alive(pid, start_time=start_time):
            return False
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        if pidfd >= 0:
            os.close(pidfd)


# -- the handle ----------------------------------------------------------------------------------
class DetachedRun(RunHandle):
    """A run under its own supervisor process: what ``launch(..., detach=True)`` and
    ``attach("runs/<id>")`` return.

    It works as a launched :class:`~orch.Run` does: ``panel()``, ``state()``, ``history()``,
    ``stop()`` (graceful), ``wait()`` (the :class:`~orch.RunResult`, read from the run dir once
    the supervisor is gone), ``close()`` (ends the run now, as ``Run.close()`` does, through its
    supervisor). ``disconnect()`` only lets go: the run goes on, and a later ``attach`` finds
    it. Leaving a ``with`` block disconnects; nothing ends the run when this process exits.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        timeout: float = 10.0,
        supervisor: subprocess.Popen[bytes] | None = None,
    ) -> None:
        self._run_dir = Path(run_dir)
        self._supervisor = supervisor  # set in the process that launched it (it reaps it)
        self._final: StateMirror | None = None
        self._mirror = StateMirror()
        self.client: MasterClient | None = None
        self.endpoint = read_attach_file(self.run_dir)
        if self.endpoint is None:
            if not (self.run_dir / "result.json").is_file():
                raise ConfigError(
                    f"{self.run_dir} has no {ATTACH_FILE}: it is not a detached run "
                    "(orch.launch(..., detach=True)), or its supervisor has not started serving yet "
                    f"(try again in a moment; its log is {self.run_dir / LOG_FILE}). "
                    f"orch.load_run({str(self.run_dir)!r}) reads what it left on disk."
                )
            return  # it ended: its final state is on disk
        if self.endpoint.host != socket.gethostname():
            raise ConfigError(
                f"run {self.endpoint.run_id} runs on host {self.endpoint.host}, and its master serves "
                "only there: attach from that host"
            )
        if self.done:
            return  # its supervisor is gone (it ended, or was killed): the run dir says how it ended
        client = self.client = self.connect()
        if client is None:
            return  # it ended just now
        try:
            client.wait_ready(timeout)
            self._mirror.poll(client)  # a wrong token fails here, clearly
        except MasterUnavailable:
            self.disconnect()
            if not self._ended_within(5.0):
                raise

    @property
    def run_dir(self) -> Path:
        return self._run_dir

    # -- what the panel and callers read -------------------------------------------------------
    @property
    def run_id(self) -> str:
        if self.endpoint is not None:
            return self.endpoint.run_id
        return self._final_state().run_id

    @property
    def token(self) -> str | None:
        return self.endpoint.token if self.endpoint is not None else None

    @property
    def supervisor_pid(self) -> int | None:
        return self.endpoint.pid if self.endpoint is not None else None

    @property
    def address(self) -> str:
        """``host:port`` of the run's master ("" once the run ended)."""
        return self.endpoint.address if self.endpoint is not None and not self.done else ""

    @property
    def done(self) -> bool:
        """True once the supervisor is gone: the run ended and its record is on disk."""
        ep = self.endpoint
        return ep is None or not process_alive(ep.pid, start_time=ep.start_time)

    def connect(self) -> MasterClient | None:
        """A new client of the run's master (with its token), or None once the run ended."""
        ep = self.endpoint
        if ep is None or self.done:
            return None
        return MasterClient(ep.address, token=ep.token, tls_ca=ep.tls_ca, tls_server_name=ep.tls_server_name)

    def state(self) -> StateMirror:
        """The run's state: polled from its master (only what changed), or read from disk once it ended."""
        client = self._client()
        if client is not None:
            try:
                return self._mirror.poll(client)
            except MasterUnavailable:
                if not self._ended_within(5.0):
                    raise
        return self._final_state()

    def history(self) -> dict[str, dict[int, dict[str, list[float]]]]:
        """``{metric: {rank: {"step": [...], "value": [...]}}}``, from the first step on."""
        return self.state().history()

    def final_state(self) -> StateMirror | None:
        return self._final_state() if self.done else None

    def log_files(self) -> dict[str, Path]:
        return {p.stem: p for p in sorted((self.run_dir / "logs").glob("*.log"))}

    # -- ending it -------------------------------------------------------------------------------
    def stop(self, reason: str = "stopped from a notebook") -> RunState:
        """Ask every rank to finish its current step and end; returns at once."""
        client = self._client()
        if client is not None:
            try:
                return client.stop_run(reason)
            except MasterUnavailable:
                if not self._ended_within(5.0):
                    raise
        return self._final_state().state

    def wait(self, timeout: float | None = None, interval: float = 0.5) -> RunResult:
        """Block until the run ended and its supervisor exited; raise :class:`orch.RunFailed` if it failed.

        The result is read from the run dir (``result.json``), so it is there even when the
        master is long gone. Interrupting the wait leaves the run going.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.run_id} still {self._last_state()} after {timeout}s")
            try:
                time.sleep(interval)
            except KeyboardInterrupt:
                raise KeyboardInterrupt(still_running(self.run_id, self._last_state())) from None
        if self._panel is not None:
            self._panel.refresh()  # the final state is drawn before the waiting cell goes on
        return self._result(self._final_state())

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """End the run now, as ``Run.close()`` does (SIGTERM to its supervisor, which terminates
        the workers and writes ``result.json``: STOPPED if a stop was asked for, else FAILED),
        wait until the supervisor is gone (SIGKILL after ``timeout`` seconds), then disconnect.

        To let go of a run and leave it going, call :meth:`disconnect` instead.
        """
        ep = self.endpoint
        if ep is not None and _signal_process(ep.pid, ep.start_time, signal.SIGTERM):
            deadline = time.monotonic() + timeout
            while not self.done and time.monotonic() < deadline:
                time.sleep(0.1)
            if not self.done:
                log.warning("run %s: its supervisor (pid %d) ignored SIGTERM; killing it", ep.run_id, ep.pid)
                _signal_process(ep.pid, ep.start_time, signal.SIGKILL)
                end = time.monotonic() + 10.0
                while not self.done and time.monotonic() < end:
                    time.sleep(0.05)
        self.disconnect()

    def disconnect(self) -> None:
        """Stop watching (the panel stops polling, the connection closes); the run goes on."""
        if self._panel is not None:
            self._panel.close()
        if self.client is not None:
            self.client.close()
            self.client = None

    def __enter__(self) -> DetachedRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.disconnect()

    def __repr__(self) -> str:
        state = self._final_state().state.value if self.done else "running"
        pid = f" supervisor pid {self.supervisor_pid}" if self.supervisor_pid and not self.done else ""
        return f"<orch.DetachedRun {self.run_id} {state} in {self.run_dir}{pid}>"

    # -- helpers ------------------------------------------------------------------------------------
    def _client(self) -> MasterClient | None:
        """This handle's client of the master (made again after ``disconnect()``); None once it ended."""
        if self.done:
            return None
        if self.client is None:
            self.client = self.connect()
        return self.client

    def _ended_within(self, seconds: float) -> bool:
        """The master did not answer: True if its supervisor is gone, or goes within ``seconds``."""
        end = time.monotonic() + seconds
        while not self.done:
            if time.monotonic() > end:
                return False
            time.sleep(0.05)
        return True

    def _final_state(self) -> StateMirror:
        if self._final is None:
            self._final = load_run(self.run_dir).state()
        return self._final

    def _last_state(self) -> str:
        return self._mirror.state.value if self._mirror.run_id else "running"

    def _result(self, m: StateMirror) -> RunResult:
        if m.state is RunState.FAILED:
            raise failure_of(m)
        return RunResult.of(m, self.run_dir)
