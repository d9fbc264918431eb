"""Where a run's ranks come from: one small contract, a launcher for each place.

As torch elastic splits an agent from what it runs, a :class:`~orch.launchers.run.Run`
owns the master, the run dir and the record, and a :class:`Launcher` owns the ranks: it
starts them once the master serves, watches them from the run's monitor thread until the
run ended, and ends them on ``close()``. :class:`~orch.launchers.local.launcher.LocalLauncher`
starts them from a forkserver on this machine; :class:`~orch.launchers.slurm.launcher.SlurmLauncher`
submits one batch job with a host agent per node.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from orch.launchers.spec import LaunchSpec
from orch.master.coordinator import Coordinator
from orch.record.store import RunStore
from orch.runtime.source import SourceMap


@dataclass
class RunParts:
    """What a launcher gets of its run, once the run's master serves."""

    spec: LaunchSpec
    run_id: str
    run_dir: Path
    coordinator: Coordinator
    store: RunStore
    meta: dict[str, object]  # run.json, which a launcher may add to
    master: str  # the master's HOST:PORT
    token: str
    tls_ca: str | None
    tls_server_name: str | None
    sources: SourceMap  # where the function's code came from (notebook cells)
    closing: threading.Event  # set by the run's close()


class Launcher(ABC):
    """Starts, watches and ends the ranks of one run."""

    # On a cluster each node's host agent starts its ranks again for a restart; on this
    # machine the launcher does.
    restarts_through_hosts = False
    # Every rank runs on this machine, as this user: they dial the master's private listener
    # (a unix socket in a 0700 folder), which no other user can connect to.
    ranks_on_this_machine = False

    def __init__(self, spec: LaunchSpec, coordinator: Coordinator, run_dir: Path) -> None:
        self.spec = spec
        self.coordinator = coordinator
        self.run_dir = run_dir

    def master_host(self, spec: LaunchSpec) -> str:
        """The address the run's master binds: one its ranks reach."""
        return spec.master_host

    def submit(self, parts: RunParts) -> None:  # noqa: B027  # most launchers start nothing early
        """Called once the master serves, before ``launch`` returns: a refusal fails the launch."""

    @abstractmethod
    def supervise(self, parts: RunParts) -> None:
        """The run's monitor thread: start the ranks and watch them until the run ended."""

    def collect_exits(self) -> None:  # noqa: B027  # a launcher whose ranks it cannot see
        """Read the exits the monitor had no time to see, before a tear-down names its cause."""

    @abstractmethod
    def end(self) -> None:
        """End the ranks now (``run.close()``); safe to call more than once."""

    @abstractmethod
    def log_files(self) -> dict[str, Path]:
        """Each rank's log, by worker id."""

    def logs_in_run_dir(self) -> dict[str, Path]:
        """The logs of ranks that write their own, in the shared run dir (a cluster's nodes)."""
        return {r.worker_id: self.run_dir / "logs" / f"{r.worker_id}.log" for r in self.coordinator.ranks}
