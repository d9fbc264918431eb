"""The process a kernel's runs live in: ``python -m orch.launchers.apart.host --reply-fd N``.

Started by :class:`orch.launchers.apart.client.Host`, once per launching process (a notebook
kernel), in a session of its own (a kernel's interrupt never reaches it). Each run the kernel
launches is a :class:`~orch.launchers.run.Run` here: its master (gRPC server and coordinator),
its launcher and its ranks, spawned from this process's forkserver, which stays warm from one
launch to the next. The kernel holds only clients; a cell holding the kernel's GIL stalls
nothing here.

Requests come on stdin, a pipe only the kernel holds: length-prefixed pickles
``{"op": "launch", "job": ...}`` (the job as :mod:`orch.launchers.detached.start` sends it) or
``{"op": "close", "run_id": ...}``; each gets one length-prefixed pickled reply on the reply fd.
The end of stdin (the kernel exited, or was killed) ends every run still live, as a launcher's
exit ends its runs, and then this process: its ranks watch it and end with it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import pickle
import signal
import struct
import sys
import threading
import time
from typing import IO, Any

from orch.errors import ConfigError, OrchError
from orch.launchers.detached.supervisor import load_job
from orch.launchers.exiting import begin_exit, launched_for
from orch.launchers.run import Run

log = logging.getLogger("orch.launchers.apart.host")  # also when run as __main__

HEADER = struct.Struct("!Q")
REAP_INTERVAL = 0.2  # seconds between looks for runs that ended (their servers stop, attach.json goes)


def read_frame(stream: IO[bytes]) -> bytes | None:
    """One length-prefixed message, or None at the end of the stream."""
    head = _read_exactly(stream, HEADER.size)
    if head is None:
        return None
    (size,) = HEADER.unpack(head)
    return _read_exactly(stream, size)


def write_frame(stream: IO[bytes], data: bytes) -> None:
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def _read_exactly(stream: IO[bytes], size: int) -> bytes | None:
    parts, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


class Runs:
    """The live runs of this host; a reaper closes each once it ended (its master stops serving)."""

    def __init__(self) -> None:
        self._runs: dict[str, Run] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="orch-host-reaper", daemon=True)
        self._reaper.start()

    def launch(self, job: bytes) -> dict[str, Any]:
        spec, sources = load_job(job)
        run = Run(spec, sources=sources)
        run.start()
        with self._lock:
            self._runs[run.run_id] = run
        log.info("run %s: master on %s, host pid %d", run.run_id, run.address, os.getpid())
        return {"run_id": run.run_id, "run_dir": str(run.run_dir)}

    def close(self, run_id: str) -> dict[str, Any]:
        with self._lock:
            run = self._runs.pop(run_id, None)
        if run is not None:
            run.close()
        return {"closed": run is not None}

    def close_all(self) -> None:
        """Every live run ends now, together (each tears its ranks down with its own grace)."""
        self._stop.set()
        with self._lock:
            runs, self._runs = list(self._runs.values()), {}
        closing = [threading.Thread(target=r.close, name=f"orch-host-close-{r.run_id}") for r in runs]
        for t in closing:
            t.start()
        for t in closing:
            t.join()

    def _reap(self) -> None:
        while not self._stop.wait(REAP_INTERVAL):
            with self._lock:
                ended = [rid for rid, r in self._runs.items() if r.done]
                runs = [self._runs.pop(rid) for rid in ended]
            for run in runs:
                with contextlib.suppress(Exception):
                    run.close()  # the record is written: its master stops serving, attach.json goes


def _answer(runs: Runs, frame: bytes) -> dict[str, Any]:
    try:
        request = pickle.loads(frame)  # from our parent, down a pipe only it holds
    except Exception as e:
        return {"error": RuntimeError(f"the request could not be read: {type(e).__name__}: {e}")}
    if not isinstance(request, dict):
        return {"error": RuntimeError(f"not a request: {type(request).__name__}")}
    try:
        if request.get("op") == "launch":
            env, cwd = request.get("env"), request.get("cwd")
            if isinstance(env, dict):  # the launching process's, as it is now: the workers get it
                os.environ.clear()
                os.environ.update({str(k): str(v) for k, v in env.items()})
            if isinstance(cwd, str):
                os.chdir(cwd)
            return runs.launch(request["job"])
        if request.get("op") == "close":
            return runs.close(str(request["run_id"]))
        return {"error": RuntimeError(f"unknown request {request.get('op')!r}")}
    except Exception as e:
        log.exception("the request %r failed", request.get("op"))
        return {"error": e}


def _reply(out: IO[bytes], answer: dict[str, Any]) -> None:
    try:
        data = pickle.dumps(answer)
        pickle.loads(data)  # what the launching process will do with it
    except Exception:  # an error that does not travel: its kind and its text do
        error = answer.get("error")
        kind = ConfigError if isinstance(error, ConfigError) else OrchError
        data = pickle.dumps(
            {"error": kind(f"{error}" if kind is ConfigError else f"{type(error).__name__}: {error}")}
        )
    write_frame(out, data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orch.launchers.apart.host", description="a kernel's runs"
    )
    parser.add_argument("--reply-fd", type=int, required=True, help="where the answers go")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    os.set_inheritable(args.reply_fd, False)  # the forkserver and the ranks never hold it
    replies = os.fdopen(args.reply_fd, "wb", buffering=0)
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the ranks inherit no end of the kernel's pipe
    os.close(devnull)
    # SIGTERM ends the runs as the kernel's exit does; the kernel's signals never reach this session.
    signal.signal(signal.SIGTERM, lambda *_: os.close(requests.fileno()))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    launched_for(os.getppid())
    runs = Runs()
    try:
        while True:
            try:
                frame = read_frame(requests)
            except (OSError, ValueError):  # SIGTERM closed it
                frame = None
            if frame is None:
                break
            _reply(replies, _answer(runs, frame))
    finally:
        started = time.monotonic()
        begin_exit()  # the runs still live end as their launcher's exit ends them, and say so
        runs.close_all()
        log.info(
            "host %d: its launching process is gone; its runs ended in %.1fs",
            os.getpid(),
            time.monotonic() - started,
        )
        with contextlib.suppress(OSError):
            replies.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
