"""The ranks of a run on a Slurm cluster: one batch job with a host agent per node.

The master stays in the launching process, bound to this machine's address on the route
to the Slurm controller (or ``master_addr``). The function reaches the nodes through the
shared run dir, signed with the run's token. The job's queue state reaches the panel
through the coordinator; the job ends with the run (see :func:`~orch.launchers.slurm.job.follow_job`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from orch.launchers.launcher import Launcher, RunParts
from orch.launchers.slurm.job import JobStatus, SlurmJob, follow_job, job_script
from orch.launchers.slurm.options import Slurm, cluster_master_host
from orch.launchers.spec import LaunchSpec
from orch.master.coordinator import Coordinator
from orch.record.writes import private_dir
from orch.runtime.function_file import write_function
from orch.wire.auth import TOKEN_ENV

log = logging.getLogger(__name__)


class SlurmLauncher(Launcher):
    """``cluster.nodes`` nodes of ``cluster.tasks_per_node`` ranks, through sbatch and srun."""

    restarts_through_hosts = True

    def __init__(self, spec: LaunchSpec, coordinator: Coordinator, run_dir: Path) -> None:
        super().__init__(spec, coordinator, run_dir)
        assert isinstance(spec.cluster, Slurm)
        self.cluster: Slurm = spec.cluster
        self.job: SlurmJob | None = None  # once submitted

    def master_host(self, spec: LaunchSpec) -> str:
        return cluster_master_host(self.cluster)

    def submit(self, parts: RunParts) -> None:
        """Submit the run's Slurm job; a refusal (no such partition, say) fails the launch."""
        spec, cluster = self.spec, self.cluster
        job = self.job = SlurmJob(cluster, {**os.environ, TOKEN_ENV: parts.token}, parts.run_id)
        private_dir(self.run_dir / "logs")  # the ranks' logs, written on the nodes
        if callable(spec.fn):
            # The function reaches the nodes through the run dir, signed with the token.
            fn_arg = [
                "--fn-file",
                str(write_function(self.run_dir.resolve(), spec.fn, parts.sources, parts.token)),
            ]
        else:
            fn_arg = ["--fn", spec.fn_name]
        script = job_script(
            cluster,
            run_id=parts.run_id,
            run_dir=self.run_dir.resolve(),
            master=parts.master,
            run_root=str(Path(spec.run_root).resolve()),
            workdir=spec.workdir,
            fn_arg=fn_arg,
            tls_ca=str(Path(parts.tls_ca).resolve()) if parts.tls_ca else None,
            heartbeat_timeout=spec.heartbeat_timeout,
            elastic=spec.min_world_size is not None,
        )
        job.submit(script, self.run_dir)
        self.coordinator.set_job(job.view(JobStatus("PENDING")))
        parts.meta["slurm_job"] = job.job_id
        parts.store.write_meta(parts.meta)
        log.info("run %s: Slurm job %s submitted (%s)", parts.run_id, job.job_id, cluster.describe())

    def supervise(self, parts: RunParts) -> None:
        assert self.job is not None  # submit() ran before the monitor started
        try:
            follow_job(self.job, self.coordinator, parts.closing, grace=self.spec.grace)
        except Exception as e:  # the run must still end, with its record, whatever broke here
            log.exception("run %s: following Slurm job %s failed", parts.run_id, self.job.job_id)
            self.coordinator.fail(f"orch lost track of Slurm job {self.job.job_id}: {e}")

    def end(self) -> None:
        if self.job is not None:
            self.job.cancel()  # the monitor cancels it too; a launch that failed early has none

    def log_files(self) -> dict[str, Path]:
        return self.logs_in_run_dir()
