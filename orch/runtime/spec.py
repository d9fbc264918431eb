"""How one worker process joins a run: the :class:`WorkerSpec` a launcher or host agent fills in."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any

from orch.errors import ConfigError
from orch.runtime.launcher_env import LaunchedAs
from orch.runtime.owner import Owner
from orch.runtime.source import SourceMap
from orch.runtime.target import TrainFn
from orch.wire.net import check_address


@dataclass
class WorkerSpec:
    """How one worker process joins a run."""

    master: str
    worker_id: str = ""
    fn: TrainFn | str | None = None  # None: the function the master names (see trust_master)
    config: dict[str, Any] | None = None  # None: the master's config
    local_rank: int = 0
    local_world_size: int = 1
    advertise_addr: str | None = None
    threads: int | None = None
    register_timeout: float = 60.0
    barrier_timeout: float = 300.0
    heartbeat_interval: float = 0.25
    master_timeout: float | None = None  # None: the master's heartbeat timeout
    collective_timeout: float = 1800.0
    run_root: str = "runs"  # checkpoints and error files go to run_root/<run-id>/
    value_cap: int = 1 << 30  # bytes the function's returned value may take (orch.runtime.values)
    owner: Owner | None = None  # end when this process (the launcher) is gone
    # The owner serves the run's master too (a launch on this machine, not a host agent's): a
    # master silent while it lives is busy, not gone (see HeartbeatSender.owner_watched)
    master_in_owner: bool = False
    token: str | None = None  # None: $ORCH_TOKEN
    tls_ca: str | None = None  # verify the master's TLS certificate against this CA
    tls_server_name: str | None = None  # ... for this name (default: the master's address)
    # Without ``fn``, run the function the master names even over a channel not verified
    # with ``tls_ca`` (the built-in example runs either way).
    trust_master: bool = False
    log_file: str | None = None
    log_dir: str | None = None  # without log_file: write to log_dir/<worker id>.log
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None  # the folder to run in and to find ``fn`` from (default: this one)
    sources: SourceMap = field(default_factory=SourceMap)  # where ``fn``'s code came from
    # On one host: the ranks meet through a file store at this path (one file per attempt, in
    # the 0700 run dir) instead of a TCP store on a port any local user could reach.
    rendezvous_file: str | None = None
    # Started by torchrun or srun: the rank (and world size) its launcher gave, which this
    # worker asks the master for. None: the master's next free rank.
    launched: LaunchedAs | None = None
    # One host agent's ranks (orch worker --nproc-per-node K): the master numbers them as one
    # block, so that RANK = GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK.
    group: str = ""

    def __post_init__(self) -> None:
        check_address(self.master)
        if not self.worker_id:
            self.worker_id = f"{socket.gethostname()}-{os.getpid()}-{self.local_rank}"
        if self.local_world_size < 1 or not 0 <= self.local_rank < self.local_world_size:
            raise ConfigError(
                f"local_rank {self.local_rank} does not fit local_world_size {self.local_world_size}"
            )
