"""The Ray kind's flags on ``orch run``: ``--ray ADDRESS`` and what each node's bundle holds.

``orch run --ray 10.0.0.5:6379 --nodes 2 --ranks-per-node 4 --gpus-per-rank 1 train.py`` is
``cluster=orch.Ray(address="10.0.0.5:6379", nodes=2, ranks_per_node=4, gpus_per_rank=1)``;
``--nodes`` and ``--master-addr`` are the command's, shared by the kinds
(:class:`~orch.launchers.clusters.ClusterFlags`). A bad value is refused by ``orch.Ray``'s own
checks. Nothing here imports Ray.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from orch.errors import ConfigError
from orch.launchers.clusters import flags_given
from orch.launchers.ray.options import Ray

DEFAULT = {f.name: f.default for f in fields(Ray)}
OWN = ("--ranks-per-node", "--cpus-per-rank", "--gpus-per-rank", "--ray-resource")


class RayFlags:
    """``orch run --ray ADDRESS``: the ranks on a Ray cluster's nodes (its ClusterFlags)."""

    selector = "--ray"
    sizes = "--nodes x --ranks-per-node"

    def add(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("on a Ray cluster (its nodes run the ranks)")
        group.add_argument(
            "--ray",
            default=None,
            metavar="ADDRESS",
            help="run the ranks on this Ray cluster: its GCS HOST:PORT, or auto ($RAY_ADDRESS, or "
            "the cluster this machine belongs to)",
        )
        group.add_argument(
            "--ranks-per-node",
            type=int,
            default=None,
            metavar="N",
            help=f"ranks per node (default {DEFAULT['ranks_per_node']})",
        )
        group.add_argument(
            "--cpus-per-rank",
            type=float,
            default=None,
            metavar="CPUS",
            help=f"CPUs each rank holds (default {DEFAULT['cpus_per_rank']:g})",
        )
        group.add_argument(
            "--gpus-per-rank",
            type=float,
            default=None,
            metavar="GPUS",
            help=f"GPUs each rank holds (default {DEFAULT['gpus_per_rank']:g})",
        )
        group.add_argument(
            "--ray-resource",
            action="append",
            default=[],
            metavar="NAME=AMOUNT",
            help="a custom Ray resource each rank holds, e.g. --ray-resource accel=1 (repeatable)",
        )

    def build(self, args: argparse.Namespace) -> Ray | None:
        if args.ray is None:
            own = flags_given(args, OWN)
            if own:
                raise ConfigError(f"{', '.join(own)} only apply to a Ray run: add --ray ADDRESS")
            return None
        chosen = {"nodes": args.nodes, "ranks_per_node": args.ranks_per_node,
                  "cpus_per_rank": args.cpus_per_rank, "gpus_per_rank": args.gpus_per_rank,
                  "master_addr": args.master_addr}  # fmt: skip
        given = {name: value for name, value in chosen.items() if value is not None}  # else Ray's defaults
        return Ray(address=args.ray, resources=_resources(args.ray_resource), **given)


def _resources(pairs: list[str]) -> dict[str, float]:
    """``["accel=1", "mem=2.5"]`` as ``{"accel": 1.0, "mem": 2.5}``."""
    held: dict[str, float] = {}
    for pair in pairs:
        name, sep, amount = pair.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            held[name] = float(amount)
        except ValueError:
            raise ConfigError(
                f"--ray-resource {pair}: write NAME=AMOUNT, a resource's name and how much of it "
                "each rank holds (e.g. --ray-resource accel=1)"
            ) from None
    return held


FLAGS = RayFlags()
