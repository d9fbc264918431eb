"""The ranks of a run on a Ray cluster: a placement group, and on each of its nodes an actor
that runs orch's host agent.

As Ray Train places its worker group, the run asks for one bundle per node (``STRICT_SPREAD``)
and waits for it within ``startup_timeout``; a placement the cluster cannot give is an error
naming what is missing, and the group is removed. One actor per bundle then starts ``orch
worker --nproc-per-node K`` (:mod:`orch.launchers.ray.actor`), so the master sees one
connection per node, as on Slurm, and the ranks get torchrun's contract from it. The function
reaches the nodes through the shared run dir, signed with the run's token, as on Slurm.

The launching process is the Ray driver: its actors and placement group are Ray's to end with
it, so a launcher that dies (``kill -9`` included) leaves nothing in the cluster; the agents
die with their actors and the ranks with their agents. The run's end, ``close()`` and Stop
end them too: the agents first get a moment to exit by themselves, then the actors are killed
and the group removed. Ray is imported only here, when a run uses it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from orch.errors import ConfigError
from orch.launchers.launcher import Launcher, RunParts
from orch.launchers.ray.actor import NodeAgent
from orch.launchers.ray.options import Ray, check_reachable, ray_master_host
from orch.launchers.spec import LaunchSpec
from orch.master.coordinator import Coordinator
from orch.record.writes import private_dir
from orch.runtime.function_file import write_function
from orch.wire.auth import TOKEN_ENV
from orch.wire.model import JobView

log = logging.getLogger(__name__)

SCHEDULER = "ray"
AGENT_START_TIMEOUT = 120.0  # seconds for the actors to be up and their agents started
END_GRACE = 5.0  # seconds the agents get to exit by themselves once the run ended


class RayJob:
    """A run's placement group and its node actors."""

    def __init__(self, cluster: Ray, run_id: str) -> None:
        self.cluster, self.run_id = cluster, run_id
        self.job_id = ""  # the placement group's id, once asked for
        self.state, self.reason = "PENDING", ""
        self.nodes: list[dict[str, Any]] = []  # where each node's agent runs, once started
        self.exits: dict[int, str] = {}  # node index -> how its agent ended
        self._pg: Any = None
        self._actors: list[Any] = []
        self._waits: list[Any] = []
        self._lock = threading.Lock()

    def connect(self) -> None:
        """This process becomes the cluster's driver (once; later runs share the connection)."""
        import ray

        if not ray.is_initialized():
            check_reachable(self.cluster)  # a wrong address fails now, not after minutes of retries
            ray.init(
                address=self.cluster.cluster_address(),
                namespace="orch",
                log_to_driver=False,
                logging_level=logging.WARNING,
                configure_logging=False,
            )

    def place(self, timeout: float) -> None:
        """Ask for one bundle per node and wait for them, or fail naming what is missing."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        bundle = self.cluster.bundle()
        self._pg = placement_group(
            [bundle] * self.cluster.nodes, strategy="STRICT_SPREAD", name=f"orch-{self.run_id}"
        )
        self.job_id = self._pg.id.hex()[:12]
        self.reason = f"placing {self.cluster.describe()}"
        try:
            ray.get(self._pg.ready(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            with contextlib.suppress(Exception):
                remove_placement_group(self._pg)
            self.state, self.reason = "FAILED", "could not be placed"
            raise ConfigError(self._unplaceable(timeout)) from None
        self.reason = ""

    def _unplaceable(self, timeout: float) -> str:
        import ray

        bundle = self.cluster.bundle()
        alive = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call,unused-ignore]
        fit = [n for n in alive if all(n.get("Resources", {}).get(k, 0.0) >= v for k, v in bundle.items())]
        held = ", ".join(f"{v:g} {k}" for k, v in bundle.items())
        return (
            f"the Ray cluster ({self.cluster.cluster_address()}) could not place {self.cluster.describe()} "
            f"within {timeout:g}s (startup_timeout): {len(fit)} of its {len(alive)} live node(s) hold "
            f"{held}, and each of the {self.cluster.nodes} nodes must be a node of its own (STRICT_SPREAD). "
            "`ray status` shows what each node has: ask for fewer nodes or less per rank, or add nodes"
        )

    def start(
        self, argv: list[str], env: dict[str, str], workdir: str, logs: Path, *, gang: bool = False
    ) -> None:
        """One actor per bundle, each starting the agent (a gang: each of the node's ranks, the
        nodes filled in order); returns once every actor started its processes."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = self.cluster.bundle()
        agent = ray.remote(NodeAgent)
        custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
        with self._lock:
            self._actors = [
                agent.options(
                    num_cpus=bundle.get("CPU", 0.0),
                    num_gpus=bundle.get("GPU", 0.0),
                    resources=custom,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self._pg, placement_group_bundle_index=i
                    ),
                    name=f"orch-{self.run_id}-node{i}",
                    max_restarts=0,
                ).remote()
                for i in range(self.cluster.nodes)
            ]
        k = self.cluster.ranks_per_node
        started = [
            a.start.remote(
                argv,
                env,
                workdir,
                str(logs / f"ray-node{i}.log"),
                list(range(i * k, (i + 1) * k)) if gang else None,
            )
            for i, a in enumerate(self._actors)
        ]
        self.nodes = ray.get(started, timeout=AGENT_START_TIMEOUT)
        # The address each node joined the cluster with (the node's own view of its address
        # follows its routes, which may not be the one the cluster knows it by).
        known = {n.get("NodeID"): n.get("NodeManagerAddress") for n in ray.nodes()}  # type: ignore[no-untyped-call,unused-ignore]
        for node in self.nodes:
            node["address"] = known.get(node["node_id"]) or node["address"]
        self._waits = [a.wait.remote() for a in self._actors]
        self.state = "RUNNING"

    def poll(self, timeout: float) -> dict[int, str]:
        """Agents that ended since the last call: node index -> how."""
        import ray

        pending = [w for i, w in enumerate(self._waits) if i not in self.exits]
        if not pending:
            return {}
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=timeout)
        ended: dict[int, str] = {}
        for ref in ready:
            i = self._waits.index(ref)
            try:
                code = ray.get(ref)
                ended[i] = f"its agent exited with code {code}"
            except ray.exceptions.ActorUnavailableError:  # its node's raylet, or the link to it, is gone
                ended[i] = (
                    "its actor cannot be reached (ActorUnavailableError: its node or its raylet is gone)"
                )
            except Exception as e:  # the actor died: its node, or its process, is gone
                ended[i] = f"its actor died ({type(e).__name__})"
            self.exits[i] = ended[i]
            if not ended[i].endswith("code 0"):  # the job's view names a node lost, run ended or not
                self.reason = "; ".join(
                    p for p in (self.reason, f"node {i} lost ({self.node_name(i)}: {ended[i]})") if p
                )
        return ended

    def node_name(self, i: int) -> str:
        """Where node ``i``'s actor runs: the Ray node's id and address (once started)."""
        if i < len(self.nodes):
            return f"Ray node {str(self.nodes[i]['node_id'])[:8]} at {self.nodes[i]['address']}"
        return "not started"

    @property
    def all_ended(self) -> bool:
        return bool(self._waits) and len(self.exits) == len(self._waits)

    def view(self) -> JobView:
        """What the run's master is told of this job: its state and its nodes (address/id)."""
        where = ",".join(f"{n['address']}/{str(n['node_id'])[:8]}" for n in self.nodes)
        return JobView(SCHEDULER, self.job_id, self.state, self.reason, where)

    def end(self) -> None:
        """Kill the actors (their agents, and so the ranks, go with them) and remove the group."""
        import ray
        from ray.util.placement_group import remove_placement_group

        if not ray.is_initialized():
            return
        with self._lock:
            actors, self._actors = self._actors, []
            pg, self._pg = self._pg, None
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        if pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)
        if self.state in ("PENDING", "RUNNING"):
            self.state = "COMPLETED" if self.all_ended else "CANCELLED"


class RayLauncher(Launcher):
    """``cluster.nodes`` Ray nodes of ``cluster.ranks_per_node`` ranks, one host agent each."""

    restarts_through_hosts = True

    def __init__(self, spec: LaunchSpec, coordinator: Coordinator, run_dir: Path) -> None:
        super().__init__(spec, coordinator, run_dir)
        assert isinstance(spec.cluster, Ray)
        self.cluster: Ray = spec.cluster
        self.job: RayJob | None = None

    def master_host(self, spec: LaunchSpec) -> str:
        return ray_master_host(self.cluster)

    def submit(self, parts: RunParts) -> None:
        """Connect, place the run's bundles (or fail the launch naming what is missing)."""
        job = self.job = RayJob(self.cluster, parts.run_id)
        job.connect()
        self.coordinator.set_job(job.view())
        job.place(self.spec.startup_timeout)
        self.coordinator.set_job(job.view())
        parts.meta["ray_placement_group"] = job.job_id
        parts.store.write_meta(parts.meta)
        log.info(
            "run %s: Ray placement group %s ready (%s)", parts.run_id, job.job_id, self.cluster.describe()
        )

    def supervise(self, parts: RunParts) -> None:
        job = self.job
        assert job is not None  # submit() ran before the monitor started
        try:
            self._start_agents(parts, job)
            self.coordinator.set_job(job.view())
            while not parts.closing.is_set() and not self.coordinator.state.done:
                ended = job.poll(0.0)
                if ended:
                    self._ended_early(job, ended)
                    if job.all_ended:
                        break
                self.coordinator.wait_changed(self.cluster.poll_interval)
            if not parts.closing.is_set():  # the agents exit once told the run ended
                deadline = time.monotonic() + self.spec.grace + END_GRACE
                while not job.all_ended and time.monotonic() < deadline:
                    job.poll(0.25)
        except Exception as e:  # the run must still end, with its record, whatever broke here
            log.exception("run %s: following its Ray nodes failed", parts.run_id)
            self.coordinator.fail(
                f"orch lost track of the run's Ray nodes (placement group {job.job_id}): {e}"
            )
        finally:
            job.end()
            self.coordinator.set_job(job.view())

    def _start_agents(self, parts: RunParts, job: RayJob) -> None:
        spec = self.spec
        logs = self.run_dir.resolve() / "logs"
        private_dir(logs)  # the ranks' logs, written on the nodes
        if callable(spec.fn):
            fn_arg = [
                "--fn-file",
                str(write_function(self.run_dir.resolve(), spec.fn, parts.sources, parts.token)),
            ]
        else:
            fn_arg = ["--fn", spec.fn_name]
        argv = [
            self.cluster.python or sys.executable, "-m", "orch.worker", "--master", parts.master,
            "--launcher", "none", "--nproc-per-node", str(self.cluster.ranks_per_node),
            "--run-root", str(Path(spec.run_root).resolve()), "--log-dir", str(logs),
            "--timeout", f"{max(60.0, spec.heartbeat_timeout):g}",
            "--threads", str(max(1, int(self.cluster.cpus_per_rank))), *fn_arg,
        ]  # fmt: skip
        if parts.tls_ca:
            argv += ["--tls-ca", str(Path(parts.tls_ca).resolve())]
        # The token reaches the agent through Ray's own calls, which only the cluster's users make.
        env = {TOKEN_ENV: parts.token, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        job.start(argv, env, spec.workdir, self.run_dir.resolve())
        log.info(
            "run %s: Ray agents started on %s",
            parts.run_id,
            ", ".join(f"{n['address']} (node {str(n['node_id'])[:8]})" for n in job.nodes),
        )

    def _ended_early(self, job: RayJob, ended: dict[int, str]) -> None:
        """Agents that ended while the run goes on: their host is gone, and its ranks with it
        (the master is told at once, naming the node, rather than finding them silent a
        heartbeat timeout later); a run none of whose nodes is left fails."""
        for i, how in sorted(ended.items()):
            log.warning("run %s: Ray node %d: %s", job.run_id, i, how)
            self.coordinator.set_job(job.view())
            if i < len(job.nodes) and not self.coordinator.state.done:
                node = job.nodes[i]
                self.coordinator.host_lost(
                    f"{node['hostname']}:{node['agent_pid']}", f"{job.node_name(i)}: {how}"
                )
        if job.all_ended and not self.coordinator.state.done:
            said = "; ".join(f"node {i}: {how}" for i, how in sorted(job.exits.items()))
            self.coordinator.fail(
                f"every Ray node of the run ended before the run did ({said}); their output: "
                f"{self.run_dir / 'ray-node0.log'} and beside it"
            )

    def end(self) -> None:
        if self.job is not None:
            self.job.end()

    def log_files(self) -> dict[str, Path]:
        return self.logs_in_run_dir()
