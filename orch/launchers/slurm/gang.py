"""A gang on a Slurm cluster: one batch job that keeps its allocation across cells.

The job runs one task per rank (``srun``), each ``python -m orch.runtime.gang --connect
HOST:PORT``: it dials the launching process (the notebook kernel) back through the gang's
:class:`~orch.launchers.cluster_gang.DialBack`, says its ``SLURM_PROCID`` (its rank) and then
takes calls as a local gang's rank takes them from its pipe (:func:`orch.runtime.gang.gang_main`).

Each call is a run with its own master in the kernel, bound where the nodes reach it, as a
Slurm launch's is. The ranks meet through a file store in the gang's folder under the run
root, which the nodes share (as a Slurm launch's run dir). ``gang.close()`` cancels the job;
the kernel's death does too (the job's watcher, :class:`~orch.launchers.slurm.job.SlurmJob`),
and a rank whose kernel connection closes exits.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from multiprocessing.connection import Connection
from pathlib import Path

from orch.errors import OrchError
from orch.launchers.cluster_gang import DialBack, SayFn, WatchFn, place_on_node
from orch.launchers.slurm.job import SlurmJob, sbatch_options, wait_gone
from orch.launchers.slurm.options import Slurm, cluster_master_host
from orch.runtime.spec import WorkerSpec
from orch.wire.auth import TOKEN_ENV

END_SECONDS = 10.0  # how long close() waits for Slurm to say the job is gone


def gang_script(
    cluster: Slurm, *, name: str, address: str, folder: Path, workdir: str, tls: list[str] | None = None
) -> str:
    """The batch script: Slurm's options, the user's set-up lines, then one gang rank per task."""
    python = cluster.python or sys.executable
    options = sbatch_options(
        cluster,
        name=name,
        tasks_per_node=cluster.tasks_per_node,
        cpus_per_task=cluster.cpus_per_rank,
        output=folder,
        workdir=workdir,
    )
    rank = [python, "-m", "orch.runtime.gang", "--connect", address, *(tls or [])]
    lines = ["#!/bin/bash", f"# {name}: one orch gang rank per task, each dialling the kernel back"]
    lines += [f"#SBATCH {o}" for o in options]
    lines += [*cluster.setup]
    lines += ["exec srun --kill-on-bad-exit=0 " + " ".join(shlex.quote(a) for a in rank)]
    return "\n".join(lines) + "\n"


class GangJob:
    """The Slurm job of a gang's ranks, and their connections, in rank order."""

    def __init__(
        self,
        cluster: Slurm,
        gang_id: str,
        start: int,
        *,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_ca: str | None = None,
    ) -> None:
        self.cluster = cluster
        self.door = DialBack(cluster_master_host(cluster), tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca)
        self.job = SlurmJob(cluster, {**os.environ, TOKEN_ENV: self.door.token}, f"gang-{gang_id}-{start}")
        self.conns: list[Connection] = []

    @property
    def name(self) -> str:
        return self.job.name

    def start(self, world_size: int, folder: Path, timeout: float, say: SayFn) -> list[Connection]:
        """Submit the job and wait (up to ``timeout`` s, the launch's ``startup_timeout``) for
        every rank to dial back; a job that ends first, or a refusal, is an :class:`OrchError`
        naming the job and its output."""
        try:
            address = self.door.open()
            script = gang_script(
                self.cluster,
                name=self.name,
                address=address,
                folder=folder.resolve(),
                workdir=os.getcwd(),
                tls=self.door.tls_args,
            )
            self.job.submit(script, folder)
            say(f"Slurm job {self.job.job_id} submitted ({self.cluster.describe()})")
            self.conns = self.door.accept(
                world_size, timeout, self._watch(world_size, say), self.cluster.poll_interval
            )
        except BaseException:
            self.end()
            raise
        finally:
            self.door.close()
        return self.conns

    def _watch(self, world_size: int, say: SayFn) -> WatchFn:
        """How the job stands while its ranks dial: news said, its end before them an error."""
        job, said = self.job, [""]

        def watch(joined: int) -> str:
            status = job.status()
            if status.ended:
                raise OrchError(
                    f"Slurm job {job.job_id} ended {status.state} before the gang's ranks joined "
                    f"({joined} of {world_size}); its output ({job.output}):\n" + job.output_tail(20)
                )
            news = " ".join(p for p in (status.state, status.reason) if p and p != "None")
            if news != said[0] and status.state != "UNKNOWN":
                say(f"Slurm job {job.job_id}: {news}")
                said[0] = news
            return f"Slurm job {job.job_id} is {status.state}: its output is {job.output}"

        return watch

    def end(self) -> None:
        """Close the ranks' connections (a rank between calls exits) and cancel the job."""
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.close()
        self.conns = []
        if self.job.job_id:
            self.job.cancel()
            wait_gone(self.job, END_SECONDS)


def on_node(spec: WorkerSpec, cluster: Slurm, token: str) -> None:
    """A call's spec for a rank on a Slurm node (:func:`~orch.launchers.cluster_gang.place_on_node`)."""
    place_on_node(
        spec,
        token,
        world_size=cluster.world_size,
        per_node=cluster.tasks_per_node,
        threads=cluster.cpus_per_rank,
    )
