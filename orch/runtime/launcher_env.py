"""The rank a launcher gave this process, read from torchrun's or Slurm's environment.

``orch worker`` started by torchrun (``torchrun --nproc-per-node K -m orch.worker``) or by
srun (one task per rank) asks the master for the rank its launcher gave it, so that the
launcher's logs, the user's own ``RANK``-dependent code and orch name the same process by
the same rank. torchrun often runs inside an srun task, so its variables win over Slurm's:
they describe this process, Slurm's describe the task that started torchrun.

Auto-detection needs a launcher's own mark: ``TORCHELASTIC_RUN_ID`` for torchrun (a stray
``RANK`` in a shell is not enough), ``SLURM_PROCID``, ``SLURM_LOCALID`` and ``SLURM_NTASKS``
together for an srun task. ``--launcher torchrun`` reads ``RANK`` / ``WORLD_SIZE`` without
torchrun's mark (other launchers that follow torch's ``env://`` convention);
``--launcher none`` ignores the environment and lets the master number the ranks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from orch.errors import ConfigError

LauncherChoice = Literal["auto", "torchrun", "slurm", "none"]
LAUNCHER_CHOICES: tuple[LauncherChoice, ...] = ("auto", "torchrun", "slurm", "none")
# A cluster gang's rank (python -m orch.runtime.gang --connect): its rank, where the process
# that started it gives it no rank of its own (a Ray actor; Slurm's task has SLURM_PROCID).
GANG_RANK_ENV = "ORCH_GANG_RANK"


@dataclass(frozen=True)
class LaunchedAs:
    """Where a launcher put this process: its rank, local rank and the sizes around them."""

    launcher: Literal["torchrun", "slurm", "orch"]  # orch: its own local launcher, rank i in process i
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int

    def __post_init__(self) -> None:
        rank, world = self.variables
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"{rank}={self.rank} does not fit {world}={self.world_size}: check the launcher"
            )
        if not 0 <= self.local_rank < self.local_world_size:
            raise ConfigError(
                f"local rank {self.local_rank} does not fit {self.local_world_size} processes on this "
                f"host ({self.launcher}'s environment): check the launcher"
            )

    @property
    def variables(self) -> tuple[str, str]:
        """The names of the rank's and the world size's variables."""
        return {
            "torchrun": ("RANK", "WORLD_SIZE"),
            "slurm": ("SLURM_PROCID", "SLURM_NTASKS"),
            "orch": ("rank", "world_size"),
        }[self.launcher]

    def describe(self) -> str:
        """``torchrun's RANK=1, WORLD_SIZE=2``: where the rank came from, for messages."""
        rank, world = self.variables
        who = {"torchrun": "torchrun's", "slurm": "Slurm's", "orch": "orch's local launcher's"}[self.launcher]
        return f"{who} {rank}={self.rank}, {world}={self.world_size}"


def launched_as(environ: Mapping[str, str], choice: LauncherChoice = "auto") -> LaunchedAs | None:
    """The launcher's placement of this process, or None when no launcher started it."""
    if choice == "none":
        return None
    if choice == "torchrun" or (choice == "auto" and "TORCHELASTIC_RUN_ID" in environ):
        return _torchrun(environ, choice)
    slurm_task = all(v in environ for v in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"))
    if choice == "slurm" or (choice == "auto" and slurm_task):
        return _slurm(environ, choice)
    return None


def _int(environ: Mapping[str, str], name: str, choice: LauncherChoice, default: int | None = None) -> int:
    text = environ.get(name)
    if text is None:
        if default is not None:
            return default
        raise ConfigError(
            f"{name} is not set, but --launcher {choice} reads the rank from it: start orch worker "
            "under that launcher, or pass --launcher none to let the master number the ranks"
        )
    try:
        return int(text)
    except ValueError:
        raise ConfigError(
            f"{name}={text[:40]!r} is not an integer: check the launcher's environment"
        ) from None


def _torchrun(environ: Mapping[str, str], choice: LauncherChoice) -> LaunchedAs:
    local_rank = _int(environ, "LOCAL_RANK", choice, 0)
    return LaunchedAs(
        "torchrun",
        rank=_int(environ, "RANK", choice),
        local_rank=local_rank,
        world_size=_int(environ, "WORLD_SIZE", choice),
        local_world_size=_int(environ, "LOCAL_WORLD_SIZE", choice, local_rank + 1),
    )


def _slurm(environ: Mapping[str, str], choice: LauncherChoice) -> LaunchedAs:
    local_rank = _int(environ, "SLURM_LOCALID", choice, 0)
    return LaunchedAs(
        "slurm",
        rank=_int(environ, "SLURM_PROCID", choice),
        local_rank=local_rank,
        world_size=_int(environ, "SLURM_NTASKS", choice),
        local_world_size=_slurm_tasks_here(environ) or local_rank + 1,
    )


def _slurm_tasks_here(environ: Mapping[str, str]) -> int | None:
    """Tasks on this node: SLURM_NTASKS_PER_NODE, else this node's entry of
    SLURM_TASKS_PER_NODE (``2(x3),1``: two tasks on each of the first three nodes, then one)."""
    per_node = environ.get("SLURM_NTASKS_PER_NODE", "")
    if per_node.isdigit() and int(per_node) > 0:
        return int(per_node)
    node = environ.get("SLURM_NODEID", "")
    counts: list[int] = []
    for part in environ.get("SLURM_TASKS_PER_NODE", "").split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if node.isdigit() and int(node) < len(counts) and counts[int(node)] > 0:
        return counts[int(node)]
    return None
