"""The handle of a detached run: :class:`DetachedRun`, what ``launch(..., detach=True)`` and
``attach("runs/<id>")`` return.

It talks to the run's master with the address and token of ``attach.json``
(:mod:`orch.launchers.attach_file`), reads the run dir once the supervisor is gone, and ends
the run through a signal to the supervisor (checked against its start time, so a reused pid
is never signalled). Starting a detached run is :mod:`orch.launchers.detached.start`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from orch.errors import ConfigError, MasterUnavailable
from orch.launchers.attach_file import ATTACH_FILE, LOG_FILE, read_attach_file
from orch.launchers.contract import RunHandle
from orch.launchers.loaded import load_run
from orch.runtime.owner import process_alive
from orch.wire.client import MasterClient, StateMirror
from orch.wire.states import RunState

log = logging.getLogger(__name__)

CLOSE_TIMEOUT = 90.0  # Run.close() in the supervisor: the monitor's join, the workers' grace, the master


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


class DetachedRun(RunHandle):
    """A run under its own supervisor process: what ``launch(..., detach=True)`` and
    ``attach("runs/<id>")`` return.

    It works as a launched :class:`~orch.Run` does: ``panel()``, ``state()``, ``history()``,
    ``stop()`` (graceful), ``wait()`` (the :class:`~orch.RunResult`, read from the run dir once
    the supervisor is gone), ``close()`` (ends the run now, as ``Run.close()`` does, through its
    supervisor; a run another process launched, and still runs, is stopped instead).
    ``disconnect()`` only lets go: the run goes on, and a later ``attach`` finds
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
        self._final_mirror: StateMirror | None = None
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
        """True once the supervisor is gone: the run ended and its record is on disk. A run of a
        process that goes on after it (a notebook kernel, `orch run`'s): once its record is."""
        ep = self.endpoint
        if ep is None or not process_alive(ep.pid, start_time=ep.start_time):
            return True
        return ep.kind != "supervisor" and (self.run_dir / "result.json").is_file()

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

    def _ended(self) -> Callable[[], bool]:
        """Ended once its supervisor exited: the result is read from the run dir (``result.json``),
        so it is there even when the master is long gone."""
        return lambda: self.done

    def _final(self) -> StateMirror:
        return self._final_state()

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """End the run now, as ``Run.close()`` does (SIGTERM to its supervisor, which terminates
        the workers and writes ``result.json``: STOPPED if a stop was asked for, else FAILED),
        wait until the supervisor is gone (SIGKILL after ``timeout`` seconds), then disconnect.

        To let go of a run and leave it going, call :meth:`disconnect` instead.
        """
        ep = self.endpoint
        if ep is not None and ep.kind != "supervisor" and not self.done:
            # The process that launched it (a kernel) is no one's to end: the run stops, gracefully.
            self.stop(f"closed from another process (pid {os.getpid()})")
            deadline = time.monotonic() + timeout
            while not self.done and time.monotonic() < deadline:
                time.sleep(0.1)
        elif ep is not None and _signal_process(ep.pid, ep.start_time, signal.SIGTERM):
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
        if self._final_mirror is None:
            self._final_mirror = load_run(self.run_dir).state()
        return self._final_mirror

    def _last_state(self) -> str:
        return self._mirror.state.value if self._mirror.run_id else "running"
