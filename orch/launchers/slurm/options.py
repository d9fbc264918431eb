"""What a Slurm run asks for, and where its master listens: ``orch.Slurm`` and its checks.

The options are checked when ``orch.Slurm(...)`` is made, so a mistake is told in the cell
that wrote it; the checks of this machine (Slurm's client commands are here, an address the
nodes reach) run before anything is submitted. Kept apart from the job they become
(:mod:`orch.launchers.slurm.job`): the launch's spec checks them without loading any of it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from orch.errors import ConfigError, OrchError
from orch.wire.net import address_towards, is_loopback

COMMAND_TIMEOUT = 30.0  # seconds for one sbatch / squeue / scancel / scontrol
_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^\d+-\d+$|^(UNLIMITED|INFINITE|infinite|unlimited)$")


class SlurmError(OrchError):
    """Slurm refused or lost the run's job (the message says what Slurm said)."""


@dataclass(frozen=True)
class Slurm:
    """Where and how to run on a Slurm cluster: pass as ``orch.launch(..., cluster=orch.Slurm(...))``.

    ``nodes * tasks_per_node`` ranks (the launch's ``world_size`` must match), one per GPU
    with ``gpus_per_node``. ``partition``, ``time`` and ``sbatch_args`` (extra options, for
    example ``("--account=proj", "--qos=high")``) go to sbatch. ``setup`` holds shell lines
    run on the first node before the ranks start (``module load ...``, ``source
    venv/bin/activate``); ``python`` is the interpreter on the nodes (default: this kernel's,
    which must then be on the shared file system too). ``master_addr`` is the address of
    this machine that the nodes reach (default: the one on the route to the Slurm controller).
    ``cpus_per_rank`` CPUs are asked for each rank (its torch threads). The job's name is
    ``orch-<run id>``: orch finds (and cancels) it by that name.
    """

    nodes: int = 1
    tasks_per_node: int = 1
    partition: str | None = None
    time: str = "1:00:00"
    gpus_per_node: int | None = None
    sbatch_args: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    python: str | None = None
    master_addr: str | None = None
    cpus_per_rank: int = 1
    poll_interval: float = 1.0

    def __post_init__(self) -> None:
        for name in ("nodes", "tasks_per_node", "cpus_per_rank"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ConfigError(f"Slurm({name}=...) must be an integer >= 1, got {value!r}")
        if self.gpus_per_node is not None and (type(self.gpus_per_node) is not int or self.gpus_per_node < 1):
            raise ConfigError(
                f"Slurm(gpus_per_node=...) must be an integer >= 1 or None, got {self.gpus_per_node!r}"
            )
        if not isinstance(self.time, str) or not _TIME.match(self.time):
            raise ConfigError(
                f"Slurm(time={self.time!r}) is not a Slurm time limit: write 'MM', 'HH:MM:SS' or 'D-HH:MM:SS'"
            )
        for name in ("sbatch_args", "setup"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(a, str) for a in value):
                raise ConfigError(f"Slurm({name}=...) must be a tuple of strings, got {value!r}")
            object.__setattr__(self, name, tuple(value))
        if self.partition is not None and not re.fullmatch(r"[\w.-]+", self.partition):
            raise ConfigError(f"Slurm(partition={self.partition!r}) is not a partition name")
        if not isinstance(self.poll_interval, (int, float)) or self.poll_interval <= 0:
            raise ConfigError(
                f"Slurm(poll_interval=...) must be a positive number of seconds, got {self.poll_interval!r}"
            )

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    def describe(self) -> str:
        gpus = f", {self.gpus_per_node} GPUs each" if self.gpus_per_node else ""
        return f"{self.nodes} node(s) of {self.tasks_per_node} ranks{gpus}"


def check_commands() -> None:
    """Slurm's client commands are here (a login node), or a ConfigError says what is missing."""
    missing = [c for c in ("sbatch", "squeue", "scancel") if shutil.which(c) is None]
    if missing:
        raise ConfigError(
            f"{', '.join(missing)} not found on PATH: launch Slurm runs from a machine with Slurm's "
            "client commands (a login node), or load its module first"
        )


def controller_host(env: dict[str, str] | None = None) -> str | None:
    """The Slurm controller's address (or name), from ``scontrol show config``; None if unknown."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT, env=env
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    # "SlurmctldHost[0]        = ctl(10.1.2.3)" or "SlurmctldHost[0] = ctl"
    m = re.search(r"^SlurmctldHost\[0\]\s*=\s*([^\s(]+)(?:\(([^)]+)\))?", out, re.M)
    if m is None:
        return None
    return m.group(2) or m.group(1)


def cluster_master_host(cluster: Slurm) -> str:
    """The address the master binds for a Slurm run: ``cluster.master_addr``, else this
    machine's address on the route to the Slurm controller (the nodes' network)."""
    if cluster.master_addr:
        return cluster.master_addr
    host = controller_host()
    if host is None:
        raise ConfigError(
            "cannot tell which address of this machine the Slurm nodes reach (`scontrol show config` "
            "names no controller): pass orch.Slurm(master_addr=...)"
        )
    address = address_towards(host, 6817)
    if is_loopback(address):
        raise ConfigError(
            f"the route to the Slurm controller ({host}) is this machine's loopback: the nodes could not "
            "reach a master there; pass orch.Slurm(master_addr=...) with an address they reach"
        )
    return address
