"""The ranks of a run on this machine: forked from a forkserver that has torch imported,
watched by a :class:`~orch.launchers.local.group.LocalAgent` that restarts them as the
coordinator's restart rule says."""

from __future__ import annotations

import os
from pathlib import Path

from orch.launchers.launcher import Launcher, RunParts
from orch.launchers.local.group import LocalAgent, WorkerGroup, starting_phase
from orch.launchers.spec import LaunchSpec
from orch.master.coordinator import Coordinator
from orch.record.writes import private_dir
from orch.runtime.launcher_env import LaunchedAs
from orch.runtime.owner import Owner
from orch.runtime.spec import WorkerSpec
from orch.wire.auth import TOKEN_ENV
from orch.wire.net import DEFAULT_RENDEZVOUS_PORT, choose_port


class LocalLauncher(Launcher):
    """``world_size`` ranks on this machine, one process each."""

    ranks_on_this_machine = True

    def __init__(self, spec: LaunchSpec, coordinator: Coordinator, run_dir: Path) -> None:
        super().__init__(spec, coordinator, run_dir)
        self.group = WorkerGroup(coordinator, run_dir, spec.grace)
        # Every rank is on this machine: they meet through a file in the run dir (0700), not a
        # TCP store any local user could write to; a port the user named keeps TCP.
        coordinator.rendezvous_file = not spec.rdzv_port
        coordinator.starting(starting_phase(spec.world_size))  # from the launch on, not its thread's start

    def supervise(self, parts: RunParts) -> None:
        agent = LocalAgent(
            self.coordinator,
            self.group,
            lambda attempt: self.worker_specs(parts, attempt),
            poll_interval=self.spec.poll_interval,
            closing=parts.closing,
        )
        agent.run()

    def worker_specs(self, parts: RunParts, attempt: int) -> list[WorkerSpec]:
        """The workers of one attempt: each dials the run's master, with its token."""
        spec = self.spec
        prefix = f"{parts.run_id}-w" if attempt == 1 else f"{parts.run_id}-a{attempt}-w"
        private_dir(self.run_dir)
        private_dir(self.run_dir / "logs")
        threads = spec.threads or max(1, (os.cpu_count() or 1) // spec.world_size)
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            TOKEN_ENV: parts.token,
        }
        if self.coordinator.rendezvous_file:
            # torchrun's MASTER_PORT, for code that reads it: the ranks meet through the run dir,
            # so nothing of orch listens there (see orch.runtime._torchrun).
            env["MASTER_PORT"] = str(
                choose_port(None, DEFAULT_RENDEZVOUS_PORT, what="MASTER_PORT", option="rdzv_port")
            )
        owner = Owner()
        return [
            WorkerSpec(
                master=parts.master,
                worker_id=f"{prefix}{i}",
                fn=spec.fn,
                config=spec.config,
                local_rank=i,
                local_world_size=spec.world_size,
                # Rank i in process i: on one host LOCAL_RANK == RANK, as under torchrun.
                launched=LaunchedAs(
                    "orch", rank=i, local_rank=i, world_size=spec.world_size, local_world_size=spec.world_size
                ),
                advertise_addr="127.0.0.1",
                threads=threads,
                heartbeat_interval=spec.heartbeat_interval,
                master_timeout=spec.heartbeat_timeout,
                owner=owner,
                master_in_owner=True,  # this process serves the run's master
                env=env,
                log_file=str(self.run_dir / "logs" / f"{prefix}{i}.log"),
                run_root=spec.run_root,
                value_cap=spec.value_cap,
                tls_ca=parts.tls_ca,
                tls_server_name=parts.tls_server_name,
                workdir=spec.workdir,
                sources=parts.sources,
                rendezvous_file=str(self.run_dir / "rendezvous")
                if self.coordinator.rendezvous_file
                else None,
            )
            for i in range(spec.world_size)
        ]

    def collect_exits(self) -> None:
        self.group.collect_exits()

    def end(self) -> None:
        self.group.terminate()

    def log_files(self) -> dict[str, Path]:
        return {wid: self.run_dir / "logs" / f"{wid}.log" for wid in self.group.worker_ids}
