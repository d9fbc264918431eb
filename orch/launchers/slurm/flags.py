"""The Slurm kind's flags on ``orch run``: ``--slurm`` and what the batch job asks for.

``orch run --slurm --nodes 2 --tasks-per-node 4 --partition gpu train.py`` is
``cluster=orch.Slurm(nodes=2, tasks_per_node=4, partition="gpu")``; ``--nodes`` and
``--master-addr`` are the command's, shared by the kinds (:class:`~orch.launchers.clusters.ClusterFlags`).
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from orch.errors import ConfigError
from orch.launchers.clusters import flags_given
from orch.launchers.slurm.options import Slurm

DEFAULT = {f.name: f.default for f in fields(Slurm)}
OWN = ("--tasks-per-node", "--partition", "--time", "--gpus-per-node", "--sbatch-arg")


class SlurmFlags:
    """``orch run --slurm``: the ranks as one batch job (its ClusterFlags)."""

    selector = "--slurm"
    sizes = "--nodes x --tasks-per-node"

    def add(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("on a Slurm cluster (from its login node)")
        group.add_argument("--slurm", action="store_true", help="run the ranks as one Slurm batch job")
        group.add_argument(
            "--tasks-per-node",
            type=int,
            default=None,
            help=f"ranks per node (default {DEFAULT['tasks_per_node']})",
        )
        group.add_argument("--partition", default=None, help="Slurm partition (default: the cluster's)")
        group.add_argument("--time", default=None, help=f"the job's time limit (default {DEFAULT['time']})")
        group.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (one rank each)")
        group.add_argument(
            "--sbatch-arg",
            action="append",
            default=[],
            help="one more sbatch option, e.g. --sbatch-arg=--qos=high",
        )

    def build(self, args: argparse.Namespace) -> Slurm | None:
        if not args.slurm:
            own = flags_given(args, OWN)
            if own:
                raise ConfigError(f"{', '.join(own)} only apply to a Slurm run: add --slurm")
            return None
        chosen = {"nodes": args.nodes, "tasks_per_node": args.tasks_per_node,
                  "partition": args.partition, "time": args.time, "gpus_per_node": args.gpus_per_node,
                  "master_addr": args.master_addr}  # fmt: skip
        given = {name: value for name, value in chosen.items() if value is not None}  # else Slurm's defaults
        return Slurm(sbatch_args=tuple(args.sbatch_arg), **given)


FLAGS = SlurmFlags()
