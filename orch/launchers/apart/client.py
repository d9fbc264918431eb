"""The launching side of runs whose master lives apart: ``orch.launch(..., apart=True)``.

:class:`Host` starts :mod:`orch.launchers.apart.host` once per process and keeps it: each launch
sends it the run's spec (as a detached launch does) and gets the run's id back once its master
serves, so a second launch finds the host's forkserver warm. The host is owned by this process:
it holds the only write end of the host's stdin, so this process's death, however it comes
(``kill -9`` included), ends the host's runs and the host, whose ranks end with it.

:class:`ApartRun` is the handle: a client of the run's master, as a panel or ``orch.attach`` is
(:class:`~orch.launchers.detached.run.DetachedRun`), that ends its run when closed.
"""

from __future__ import annotations

import contextlib
import copy
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from orch.errors import OrchError
from orch.launchers.apart.host import HEADER, write_frame
from orch.launchers.detached.run import DetachedRun
from orch.launchers.detached.start import job_of
from orch.launchers.loaded import load_run
from orch.launchers.spec import LaunchSpec
from orch.wire.client import StateMirror
from orch.wire.states import RunState

START_TIMEOUT = 120.0  # the host imports torch and grpc, then starts a master: seconds on a loaded machine
CLOSE_TIMEOUT = 120.0


class HostGone(OrchError):
    """The host process ended (or never answered)."""


class Host:
    """This process's host of runs: started on the first launch, kept for the next ones."""

    _current: Host | None = None
    _guard = threading.Lock()

    def __init__(self) -> None:
        reply_r, reply_w = os.pipe()
        # Its log: an unlinked file only this process and the host hold, never the kernel's own
        # output, which a Jupyter kernel shows in whichever cell runs.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in release())
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "orch.launchers.apart.host", "--reply-fd", str(reply_w)],
                stdin=subprocess.PIPE,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                pass_fds=(reply_w,),
                start_new_session=True,  # a kernel's interrupt (its process group's SIGINT) stays there
                cwd=os.getcwd(),
            )
        except BaseException:
            os.close(reply_r)
            self.log.close()
            raise
        finally:
            os.close(reply_w)
        self._replies = os.fdopen(reply_r, "rb", buffering=0)
        self._lock = threading.Lock()
        threading.Thread(target=self.proc.wait, name="orch-host-reaper", daemon=True).start()

    @classmethod
    def get(cls) -> Host:
        """The host of this process's runs, started if there is none (or it died)."""
        with cls._guard:
            if cls._current is None or cls._current.proc.poll() is not None:
                if cls._current is not None:
                    cls._current.release()
                cls._current = Host()
            return cls._current

    @classmethod
    def running(cls) -> Host | None:
        host = cls._current
        return host if host is not None and host.proc.poll() is None else None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ask(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request; its answer (an error it raised is raised here)."""
        with self._lock:
            assert self.proc.stdin is not None
            try:
                write_frame(self.proc.stdin, pickle.dumps(request))
            except (BrokenPipeError, ValueError) as e:
                raise HostGone(f"the process hosting this kernel's runs (pid {self.pid}) is gone") from e
            answer = self._read(time.monotonic() + timeout)
        error = answer.get("error")
        if isinstance(error, BaseException):
            raise error
        return answer

    def _read(self, deadline: float) -> dict[str, Any]:
        head = self._exactly(HEADER.size, deadline)
        (size,) = HEADER.unpack(head)
        answer = pickle.loads(self._exactly(size, deadline))  # from our own child, down our own pipe
        if not isinstance(answer, dict):
            raise HostGone(f"the host (pid {self.pid}) answered {type(answer).__name__}")
        return answer

    def _exactly(self, size: int, deadline: float) -> bytes:
        data = b""
        while len(data) < size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._gone("did not answer in time")
            readable, _, _ = select.select([self._replies], [], [], min(left, 1.0))
            if not readable:
                if self.proc.poll() is not None:
                    raise self._gone(f"exited (code {self.proc.returncode})")
                continue
            chunk = self._replies.read(size - len(data))
            if not chunk:
                raise self._gone("exited")
            data += chunk
        return data

    def _gone(self, what: str) -> HostGone:
        """The host failed us, with what it said last (its log's end)."""
        try:
            size = os.fstat(self.log.fileno()).st_size
            text = os.pread(self.log.fileno(), 16 * 1024, max(0, size - 16 * 1024)).decode("utf-8", "replace")
        except (OSError, ValueError):
            text = ""
        tail = "\n".join(text.rstrip().splitlines()[-20:])
        said = f"\n--- its last lines ---\n{tail}" if tail else ""
        return HostGone(f"the process hosting this kernel's runs (pid {self.pid}) {what}{said}")

    def end(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Close the host's stdin: its runs end, then it does."""
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        if self.proc.poll() is not None:
            self.release()

    def release(self) -> None:
        """Let go of the pipes of a host that ended."""
        with self._lock:
            for stream in (self.proc.stdin, self._replies, self.log):
                with contextlib.suppress(OSError, ValueError):
                    if stream is not None:
                        stream.close()


class ApartRun(DetachedRun):
    """A run launched from this process whose master lives in the host: ``panel()``,
    ``state()``, ``history()``, ``stop()``, ``wait()`` and ``stacks()`` read and ask its master as
    any client does; ``close()`` (or the end of a ``with`` block) ends it, as ``Run.close()`` does."""

    def __init__(self, host: Host, run_dir: Path, spec: LaunchSpec) -> None:
        self.host = host
        self.spec = spec
        super().__init__(run_dir)

    @property
    def master_port(self) -> int | None:
        """The port its master serves on (None once it ended)."""
        address = self.address
        return int(address.rsplit(":", 1)[1]) if address else None

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Tear the run down now (its ranks, then its master); its record says how it ended."""
        if not self.done:
            with contextlib.suppress(HostGone):
                self.host.ask({"op": "close", "run_id": self.run_id}, timeout)
        self.disconnect()

    def _final_state(self) -> StateMirror:
        """As the run dir says; a run whose host died before it wrote the record failed, and
        the master's death, not a rank, is its cause."""
        if self._final_mirror is None:
            mirror = load_run(self.run_dir).state()
            if not (self.run_dir / "result.json").is_file():
                code = None
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = self.host.proc.wait(2.0)  # a process that ended is reaped at once
                how = f"was killed by {_signal_name(-code)}" if code is not None and code < 0 else "ended"
                mirror.state = RunState.FAILED
                mirror.failure = (
                    f"the run's master died: the process hosting this kernel's runs (pid {self.host.pid}) "
                    f"{how} before the run did, and wrote no record; the run's ranks ended with it"
                )
            self._final_mirror = mirror
        return self._final_mirror

    def __enter__(self) -> ApartRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = self._final_state().state.value if self.done else self._last_state()
        return (
            f"<orch.Run {self.run_id} {state} world_size={self.spec.world_size} master pid {self.host.pid}>"
        )


_LIVE: weakref.WeakSet[ApartRun] = weakref.WeakSet()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def in_notebook_kernel() -> bool:
    """True in a Jupyter kernel (an IPython shell with a kernel), where cells the user runs next
    share the process with whatever orch runs in it."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    with contextlib.suppress(Exception):
        return getattr(ipython.get_ipython(), "kernel", None) is not None
    return False


def launch_apart(spec: LaunchSpec, *, start_timeout: float = START_TIMEOUT) -> ApartRun:
    """Start ``spec`` in this process's host; return once its master serves."""
    sent = copy.copy(spec)
    sent.run_root = os.path.abspath(spec.run_root)  # the host's working dir is where it started
    # The host's environment and working dir become this process's, as they are now: the
    # workers get them, as a launch from here gives them its own.
    request = {"op": "launch", "job": job_of(sent), "env": dict(os.environ), "cwd": os.getcwd()}
    host = Host.get()
    answer = host.ask(request, start_timeout)
    run = ApartRun(host, Path(answer["run_dir"]), spec)
    _LIVE.add(run)
    return run


def live_apart_runs() -> list[ApartRun]:
    return [r for r in list(_LIVE) if not r.done]


def close_all_apart() -> None:
    for run in list(_LIVE):
        with contextlib.suppress(Exception):
            run.close()
