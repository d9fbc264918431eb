"""The Slurm cluster kind, as :mod:`orch.launchers.clusters` finds it: ``cluster=orch.Slurm(...)``.

Loaded when a cluster is first named (never by ``import orch``, nor in a rank).
"""

from __future__ import annotations

from typing import Any

from orch.launchers.clusters import ClusterKind
from orch.launchers.slurm.flags import FLAGS
from orch.launchers.slurm.gang import GangJob, on_node
from orch.launchers.slurm.launcher import SlurmLauncher
from orch.launchers.slurm.options import Slurm, check_commands, cluster_master_host


def _gang_job(cluster: Slurm, gang_id: str, restarts: int, tls: dict[str, Any]) -> GangJob:
    return GangJob(cluster, gang_id, restarts, **tls)


def _check(cluster: Slurm) -> None:
    check_commands()


KIND = ClusterKind(
    name="slurm",
    options=Slurm,
    launcher=lambda: SlurmLauncher,
    master_host=cluster_master_host,
    check=_check,
    gang_job=_gang_job,
    place_rank=on_node,
    cli=FLAGS,
)
