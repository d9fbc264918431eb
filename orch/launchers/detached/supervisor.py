"""The supervisor of a detached run: ``python -m orch.launchers.detached.supervisor --status-fd N``.

Started by :func:`orch.launchers.detached.start.start_detached` in a session of its own. It reads the run's
spec from its stdin (a pipe only its parent holds), reports the run id and then "serving" or
its start-up error on the status pipe, writes ``attach.json`` once its master serves, and
exits after the run ended and ``result.json`` was written; SIGTERM makes it end the run as
``Run.close()`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pickle
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import IO, Any

from orch.errors import ConfigError, OrchError
from orch.launchers.attach_file import ATTACH_FILE, LOG_FILE
from orch.launchers.contract import exit_code
from orch.launchers.run import Run
from orch.launchers.spec import LaunchSpec
from orch.record.writes import own_dir, private_dir

log = logging.getLogger("orch.launchers.detached.supervisor")  # also when run as __main__


class _Status:
    """The pipe to the launching process: one JSON object per line; its reader may be gone."""

    def __init__(self, fd: int) -> None:
        os.set_inheritable(fd, False)  # the forkserver and the workers never hold it
        self._file: IO[bytes] | None = os.fdopen(fd, "wb", buffering=0)

    def send(self, **message: Any) -> None:
        if self._file is None:
            return
        try:
            self._file.write(json.dumps(message).encode() + b"\n")
        except OSError:  # the launcher died: the run goes on without anyone to tell
            self.close()

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


class _Signals:
    """SIGTERM and SIGINT ask the supervisor to end the run; a plain flag, safe in a handler."""

    def __init__(self) -> None:
        self.closing = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def _handle(self, signum: int, _frame: Any) -> None:
        self.closing = True


def load_job(data: bytes) -> tuple[LaunchSpec, Any]:
    """The launching process's spec and source map; its ``sys.path`` first, for what it imports."""
    job = pickle.loads(data)  # from our parent, down a pipe only it holds
    if not isinstance(job, dict) or not isinstance(job.get("sys_path"), list):
        raise OrchError("the launching process sent no run spec (it may have died while starting the run)")
    sys.path[:] = [p for p in job["sys_path"] if isinstance(p, str)] + [
        p for p in sys.path if p not in job["sys_path"]
    ]
    spec = pickle.loads(job["spec"])
    if not isinstance(spec, LaunchSpec):
        raise OrchError(f"expected a LaunchSpec from the launching process, got {type(spec).__name__}")
    return spec, job.get("sources")


def _redirect_output(run_dir: Path) -> None:
    """From here on this process's stdout and stderr (and its forkserver's) go to ``supervisor.log``."""
    with own_dir(run_dir) as folder:
        fd = folder.append_fd(LOG_FILE)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main(argv: list[str] | None = None) -> int:
    """The supervisor of :func:`start_detached`:
    ``python -m orch.launchers.detached.supervisor --status-fd N``."""
    parser = argparse.ArgumentParser(
        prog="python -m orch.launchers.detached.supervisor", description="an orch run's supervisor"
    )
    parser.add_argument("--status-fd", type=int, required=True, help="where to report start-up")
    args = parser.parse_args(argv)
    status = _Status(args.status_fd)
    signals = _Signals()
    try:
        data = sys.stdin.buffer.read()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        spec, sources = load_job(data)
        run = Run(spec, sources=sources)  # the launcher's: the notebook cells' source and labels
        run.supervised = True  # its attach.json names this process: closing the run may end it
        private_dir(run.run_dir)
        _redirect_output(run.run_dir)
    except Exception as e:
        traceback.print_exc()
        status.send(error=f"{type(e).__name__}: {e}", config=isinstance(e, ConfigError))
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    status.send(run_id=run.run_id, pid=os.getpid())
    attach_path = run.run_dir / ATTACH_FILE
    try:
        try:
            run.start()
        except Exception as e:
            log.exception("run %s: the start failed", run.run_id)
            status.send(error=str(e), config=isinstance(e, ConfigError))
            return 2
        status.send(ready=True)  # the run wrote attach.json once its master served
        status.close()
        log.info("run %s: supervisor pid %d, master on %s", run.run_id, os.getpid(), run.address)
        while not run.done and not signals.closing:
            time.sleep(0.2)
        if not run.done:
            log.info("run %s: asked to end it (SIGTERM): closing the run", run.run_id)
        run.close()  # a run still going ends here; result.json is written before it returns
        log.info("run %s: ended %s", run.run_id, run.coordinator.state.value)
        return exit_code(run.coordinator.state)
    finally:
        with contextlib.suppress(OSError), own_dir(attach_path.parent) as folder:
            folder.remove(attach_path.name)  # the address and token are good for nothing now
        status.close()


if __name__ == "__main__":
    sys.exit(main())
