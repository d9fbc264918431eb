"""A run named from elsewhere: by its master's address, its run dir or its run id.

:class:`AttachedRun` watches any master over gRPC (``orch master``, another user's run
with its token). :func:`open_run` is the one place a name becomes a run: a run of this
process, a detached run still going (followed through its master), or the record on disk.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from orch.errors import ConfigError
from orch.launchers.apart.client import live_apart_runs
from orch.launchers.attach_file import ATTACH_FILE
from orch.launchers.contract import RunHandle
from orch.launchers.detached.run import DetachedRun
from orch.launchers.loaded import load_run
from orch.launchers.run import live_runs
from orch.record.names import no_run, run_dir_named
from orch.wire.auth import token_from_env
from orch.wire.client import MasterClient, StateMirror
from orch.wire.net import split_address
from orch.wire.states import RunState


class AttachedRun(RunHandle):
    """A run whose master was started elsewhere (``orch master``), read over gRPC."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 10.0,
        token: str | None = None,
        tls_ca: str | Path | None = None,
    ) -> None:
        self._address = address
        self.token = token_from_env(token)
        self.tls_ca = tls_ca
        self.client = self.connect()
        self._mirror = StateMirror()
        self.client.wait_ready(timeout)
        self.client.get_state()  # a wrong token or a server that is not orch fails here, clearly

    @property
    def address(self) -> str:
        return self._address

    @property
    def run_id(self) -> str:
        return self._mirror.run_id or self.state().run_id

    def connect(self) -> MasterClient:
        return MasterClient(self.address, token=self.token, tls_ca=self.tls_ca)

    def state(self) -> StateMirror:
        """The run's state, brought up to date with only what changed since the last call."""
        return self._mirror.poll(self.client)

    def stop(self, reason: str = "stopped from a notebook") -> RunState:
        return self.client.stop_run(reason)

    def close(self) -> None:
        super().close()
        self.client.close()

    def __repr__(self) -> str:
        return f"<orch.AttachedRun {self._mirror.run_id or '?'} {self._mirror.state.value} at {self.address}>"


def open_run(
    target: Any,
    run_root: str | Path = "runs",
    *,
    token: str | None = None,
    tls_ca: str | Path | None = None,
    timeout: float = 10.0,
    follow: bool = False,
) -> Any:
    """The run ``target`` names, the one place a name becomes a run:

    - a run object: as it is;
    - a run of this process, by its run id or run dir: that run itself;
    - a run dir, a run id under ``run_root`` or the unique start of one
      (:func:`orch.record.names.run_dir_named`): a detached run still going, followed through
      its master (``follow``: also one that ended, read through the same handle), else the
      record on disk (:func:`orch.load_run`);
    - a master's ``HOST:PORT``: an :class:`AttachedRun` (``token`` defaults to
      ``$ORCH_TOKEN``; ``tls_ca`` verifies a master serving TLS).
    """
    if not isinstance(target, (str, os.PathLike)):
        return target
    for run in [*live_runs(), *live_apart_runs()]:
        if os.fspath(target) == run.run_id:
            return run
    path = run_dir_named(target, run_root)
    if path is None:
        address = os.fspath(target)
        try:
            split_address(address)
        except ConfigError as e:
            raise no_run(address, run_root, address=True) from e
        return AttachedRun(address, timeout=timeout, token=token, tls_ca=tls_ca)
    if token is not None or tls_ca is not None:
        raise ConfigError(
            f"{target} is a run dir: its token and TLS CA are read from its attach.json; "
            "leave token= and tls_ca= out (they are for a master's HOST:PORT)"
        )
    for run in [*live_runs(), *live_apart_runs()]:
        if run.run_dir is not None and run.run_dir.resolve() == path.resolve():
            return run
    if follow or ((path / ATTACH_FILE).exists() and not (path / "result.json").exists()):
        return DetachedRun(path, timeout=timeout)  # followed through its master
    return load_run(path)
