"""A run named from elsewhere: by its master's address, its run dir or its run id.

:class:`AttachedRun` watches any master over gRPC (``orch master``, another user's run
with its token). :func:`open_run` is the one place a name becomes a run: a run of this
process, a detached run still going (followed through its master), or the record on disk.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from orch._viewable import Viewable
from orch.errors import ConfigError
from orch.launchers.detach import ATTACH_FILE, DetachedRun
from orch.launchers.run import failure_of, live_runs, still_running
from orch.record.rundir import load_run
from orch.wire.auth import token_from_env
from orch.wire.client import MasterClient, StateMirror
from orch.wire.states import RunState


class AttachedRun(Viewable):
    """A run whose master was started elsewhere (``orch master``), read over gRPC."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 10.0,
        token: str | None = None,
        tls_ca: str | Path | None = None,
    ) -> None:
        self.address = address
        self.token = token_from_env(token)
        self.tls_ca = tls_ca
        self.client = self.connect()
        self._mirror = StateMirror()
        self.client.wait_ready(timeout)
        self.client.get_state()  # a wrong token or a server that is not orch fails here, clearly

    def connect(self) -> MasterClient:
        return MasterClient(self.address, token=self.token, tls_ca=self.tls_ca)

    def state(self) -> StateMirror:
        """The run's state, brought up to date with only what changed since the last call."""
        return self._mirror.poll(self.client)

    def history(self) -> dict[str, dict[int, dict[str, list[float]]]]:
        return self.state().history()

    def stop(self, reason: str = "stopped from a notebook") -> RunState:
        return self.client.stop_run(reason)

    def wait(self, timeout: float | None = None, interval: float = 0.5) -> StateMirror:
        """Poll until the run ends; raise :class:`orch.RunFailed` if it failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        mirror = self.state()
        while not mirror.state.done:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {mirror.run_id} still {mirror.state.value} after {timeout}s")
            try:
                time.sleep(interval)
            except KeyboardInterrupt:
                raise KeyboardInterrupt(still_running(mirror.run_id, mirror.state.value)) from None
            mirror = self.state()
        if self._panel is not None:
            self._panel.refresh()  # the final state is drawn before the waiting cell goes on
        if mirror.state is RunState.FAILED:
            raise failure_of(mirror)
        return mirror

    def log_files(self) -> dict[str, Path]:
        return {}

    def final_state(self) -> StateMirror | None:
        return None

    def close(self) -> None:
        if self._panel is not None:
            self._panel.close()
        self.client.close()



def run_dir_of(target: str | Path, run_root: Path) -> Path | None:
    """The run dir ``target`` names (a folder, or a run id under ``run_root``), else None."""
    path = Path(target)
    if path.is_dir():
        return path
    text = str(target)
    if text and "/" not in text and os.sep not in text and text not in (".", ".."):
        candidate = run_root / text
        if candidate.is_dir():
            return candidate
    return None


def open_run(target: Any, run_root: str | Path = "runs") -> Any:
    """The run ``target`` names: a run object as it is; a run dir or a run id under
    ``run_root``: this process's live run of that dir, else a detached run still going
    (followed through its master), else the record on disk (:func:`orch.load_run`)."""
    if not isinstance(target, (str, os.PathLike)):
        return target
    path = run_dir_of(Path(target), Path(run_root))
    if path is None:
        raise ConfigError(
            f"no run {str(target)!r}: not a run dir, nor a run id under {run_root}/ (see orch.runs())"
        )
    for run in live_runs():
        if run.run_dir.resolve() == path.resolve():
            return run
    if (path / ATTACH_FILE).exists() and not (path / "result.json").exists():
        return DetachedRun(path)  # a detached run still going: followed through its master
    return load_run(path)
