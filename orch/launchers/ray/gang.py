"""A gang on a Ray cluster: one placement group that keeps its nodes across cells.

As a run's, the gang's placement group holds one bundle per node (``STRICT_SPREAD``) and an
actor on each (:class:`~orch.launchers.ray.launcher.RayJob`); for a gang each actor starts its
node's ranks, ``python -m orch.runtime.gang --connect HOST:PORT`` with ``ORCH_GANG_RANK`` (the
nodes filled in order), which dial the kernel back through the gang's
:class:`~orch.launchers.cluster_gang.DialBack` and take its calls. Each call is a run with its
own master in the kernel, bound where the nodes reach it; the ranks meet through a file store
in the gang's folder under the run root, which the nodes share. ``gang.close()`` kills the
actors and removes the group; the kernel's death does too (Ray ends a dead driver's actors),
and a rank whose kernel connection closes exits.
"""

from __future__ import annotations

import contextlib
import os
import sys
from multiprocessing.connection import Connection
from pathlib import Path

from orch.errors import OrchError
from orch.launchers.cluster_gang import DialBack, SayFn, WatchFn, place_on_node
from orch.launchers.ray.launcher import RayJob
from orch.launchers.ray.options import Ray, ray_master_host
from orch.runtime.spec import WorkerSpec
from orch.wire.auth import TOKEN_ENV


class RayGangJob:
    """The placement group and actors of a gang's ranks, and their connections, in rank order."""

    def __init__(
        self,
        cluster: Ray,
        gang_id: str,
        start: int,
        *,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_ca: str | None = None,
    ) -> None:
        self.cluster = cluster
        self.door = DialBack(ray_master_host(cluster), tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca)
        self.job = RayJob(cluster, f"gang-{gang_id}-{start}")
        self.conns: list[Connection] = []

    @property
    def name(self) -> str:
        return f"orch-{self.job.run_id}"

    def start(self, world_size: int, folder: Path, timeout: float, say: SayFn) -> list[Connection]:
        """Place the gang's nodes, start its ranks on them and wait (up to ``timeout`` s, the
        launch's ``startup_timeout``, for both) for every rank to dial back; a placement the
        cluster cannot give, or a node whose ranks end first, is an error naming it."""
        job = self.job
        try:
            address = self.door.open()
            job.connect()
            job.place(timeout)
            say(f"Ray placement group {job.job_id} ready ({self.cluster.describe()})")
            argv = [self.cluster.python or sys.executable, "-m", "orch.runtime.gang", "--connect", address]
            env = {TOKEN_ENV: self.door.token, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            job.start([*argv, *self.door.tls_args], env, os.getcwd(), folder.resolve(), gang=True)
            self.conns = self.door.accept(
                world_size, timeout, self._watch(world_size, folder), self.cluster.poll_interval
            )
        except BaseException:
            self.end()
            raise
        finally:
            self.door.close()
        return self.conns

    def _watch(self, world_size: int, folder: Path) -> WatchFn:
        """A node whose ranks ended before they all joined is an error naming it and its output."""
        job = self.job

        def watch(joined: int) -> str:
            ended = job.poll(0.0)
            if ended:
                i, how = min(ended.items())
                log = folder.resolve() / f"ray-node{i}.log"
                tail = log.read_text(errors="replace").splitlines()[-20:] if log.exists() else []
                raise OrchError(
                    f"the gang's Ray node {i} ({job.node_name(i)}) ended before its ranks joined "
                    f"({joined} of {world_size}): {how}; its output ({log}):\n" + "\n".join(tail)
                )
            return f"Ray placement group {job.job_id} is placed; the nodes' output is in {folder.resolve()}"

        return watch

    def end(self) -> None:
        """Close the ranks' connections (a rank between calls exits), kill the actors and
        remove the group."""
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.close()
        self.conns = []
        self.job.end()


def on_ray_node(spec: WorkerSpec, cluster: Ray, token: str) -> None:
    """A call's spec for a gang rank on a Ray node (:func:`~orch.launchers.cluster_gang.place_on_node`)."""
    place_on_node(
        spec,
        token,
        world_size=cluster.world_size,
        per_node=cluster.ranks_per_node,
        threads=max(1, int(cluster.cpus_per_rank)),
    )
