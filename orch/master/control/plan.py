"""What a run's master is told to hold its run to: one frozen value, made from the launch's spec.

The launch options are declared once, with their help and checks, on
:class:`orch.launchers.spec.LaunchSpec`; :meth:`~orch.launchers.spec.LaunchSpec.coordinator`
turns the part of them the master acts on into a :class:`RunPlan`. The defaults here are the
same constants the spec's options default to, for a master made without a spec (a test, a
benchmark).
"""

from __future__ import annotations

from dataclasses import dataclass

from orch.master.control.pace import HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT
from orch.master.control.progress import STARTUP_TIMEOUT
from orch.master.control.series import MAX_POINTS_IN_MEMORY
from orch.master.control.stopping import STOP_GRACE

EXAMPLE_FN = "orch.example:train"


@dataclass(frozen=True)
class RunPlan:
    """The run a master coordinates: its ranks and function, and the rules it judges them by."""

    world_size: int
    fn: str = EXAMPLE_FN  # what the ranks run, as the registration tells them
    config_json: str = "{}"
    total_steps: int = 0
    seed: int | None = None  # each rank seeds its generators with seed + rank; None: from the OS
    rendezvous_port: int = 0  # the fixed torch.distributed port, or 0: the one rank 0 binds
    backend: str = ""  # "" : nccl when every rank has a GPU, else gloo
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT
    heartbeat_interval: float = HEARTBEAT_INTERVAL
    hang_timeout: float | None = None
    on_hang: str = "warn"
    startup_timeout: float = STARTUP_TIMEOUT
    stop_grace: float = STOP_GRACE
    max_attempts: int = 1
    restart_through_hosts: bool = False  # host agents restart the ranks (orch worker, Slurm, Ray)
    min_world_size: int | None = None  # elastic: a restart may go on with this many ranks
    max_points_in_memory: int = MAX_POINTS_IN_MEMORY

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {self.world_size}")
