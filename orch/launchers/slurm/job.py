"""Runs on a Slurm cluster, launched from a notebook on its login node.

``orch.launch(train, world_size=8, cluster=orch.Slurm(nodes=2, tasks_per_node=4))`` keeps the
master in the kernel, bound to the address the nodes reach, and submits one batch job. Its
script starts, with ``srun``, one host agent per node (``orch worker --nproc-per-node K``),
which spawns that node's K ranks. One agent per node rather than one ``orch worker`` per task:

- a failure restarts the group inside the same allocation: each node's agent spawns its ranks
  again when the master opens the next attempt (:mod:`orch.runtime._host_attempts`), with no second
  wait in the queue;
- the master takes one heartbeat call per node per interval, not one per rank;
- the agent names a rank that the OOM killer took, where srun would only see a task gone.

Slurm is driven through its commands, as dask-jobqueue and ipyparallel do: ``sbatch
--parsable`` to submit, ``squeue`` for the job's state while it waits and runs (shown in the
panel and the dashboard: "PENDING in the queue: Resources", then the node list), ``scancel``
to end it. ``sacct`` is not used: clusters without accounting have none.

What crosses to the nodes, and how:

- the training function, through the run dir on the shared file system, never the network:
  ``function.pkl``, 0600, carrying an HMAC-SHA256 of the run id and the pickle keyed by the
  run's token, which the worker checks before it unpickles anything (:func:`read_function`);
- the token, in the job's environment (sbatch exports the submitting environment), never on
  a command line, where ``ps`` and ``squeue`` would show it;
- the master's address, in the job script.

The job ends with the run: after a stop (graceful, then ``scancel``), a failure, ``close()``,
or the death of the launching process, which a small watcher process notices (its pipe from
the kernel closes) to ``scancel`` the job, so nothing stays queued or running.

This module holds the job: its script, its submission and state (:class:`SlurmJob`), the
watcher that cancels it when the launching process dies (``python -m orch.launchers.slurm.job
--cancel-when-orphaned``), and :func:`follow_job`, which ties it to the run. The options are
in :mod:`orch.launchers.slurm.options`, the signed function file in
:mod:`orch.runtime.function_file`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from orch.launchers.slurm.options import COMMAND_TIMEOUT, Slurm, SlurmError
from orch.master.control.pace import HEARTBEAT_TIMEOUT
from orch.record.store import tail
from orch.record.writes import own_dir
from orch.runtime.owner import process_alive
from orch.wire.auth import TOKEN_ENV
from orch.wire.model import JobView

if TYPE_CHECKING:
    from orch.master.coordinator import Coordinator

SCHEDULER = "slurm"
JOB_END_GRACE = 10.0  # seconds a job may take to end by itself once its run ended (and the reverse);
# its host agents hear of the end at their next SyncHost (about a second) and end their ranks:
# on a loaded node that took more than 3 s, and the job was cancelled rather than COMPLETED.

# Slurm's job states after which the job is over (squeue --states=all still lists them a while).
ENDED = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "SPECIAL_EXIT",
        "REVOKED",
        "TIMEOUT",
        "GONE",  # orch's word: squeue no longer knows the job
    }
)


def job_name(run_id: str) -> str:
    """The name of a run's job: unique, so the job can be found (and cancelled) by it."""
    return f"orch-{run_id}"


def sbatch_options(
    cluster: Slurm, *, name: str, tasks_per_node: int, cpus_per_task: int, output: Path, workdir: str
) -> list[str]:
    """The ``#SBATCH`` options of an orch job: its name, its shape, its output in ``output``."""
    options = [
        f"--job-name={name}",
        f"--nodes={cluster.nodes}",
        f"--ntasks-per-node={tasks_per_node}",
        f"--cpus-per-task={cpus_per_task}",
        # The token reaches the job in its environment: exported whatever SBATCH_EXPORT says.
        "--export=ALL",
        f"--time={cluster.time}",
        f"--output={output / 'slurm-%j.out'}",
        f"--chdir={workdir}",
    ]
    if cluster.partition:
        options.append(f"--partition={cluster.partition}")
    if cluster.gpus_per_node:
        options.append(f"--gpus-per-node={cluster.gpus_per_node}")
    return options


def job_script(
    cluster: Slurm,
    *,
    run_id: str,
    run_dir: Path,
    master: str,
    run_root: str,
    workdir: str,
    fn_arg: list[str],
    tls_ca: str | None = None,
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
    elastic: bool = False,
) -> str:
    """The batch script: Slurm's options, the user's set-up lines, then one host agent per node."""
    python = cluster.python or sys.executable
    cpus = cluster.tasks_per_node * cluster.cpus_per_rank
    options = sbatch_options(
        cluster, name=job_name(run_id), tasks_per_node=1, cpus_per_task=cpus, output=run_dir, workdir=workdir
    )
    if elastic:  # a node that fails leaves the job running on the others (orch restarts without it)
        options.append("--no-kill")
    worker = [
        python, "-m", "orch.worker", "--master", master, "--launcher", "none",
        "--nproc-per-node", str(cluster.tasks_per_node), "--run-root", run_root,
        "--log-dir", str(run_dir / "logs"),
        "--timeout", f"{max(60.0, heartbeat_timeout):g}", *fn_arg,
    ]  # fmt: skip
    if tls_ca:
        worker += ["--tls-ca", tls_ca]
    lines = ["#!/bin/bash", f"# orch run {run_id}: one host agent per node, each starting its node's ranks"]
    lines += [f"#SBATCH {o}" for o in options]
    lines += [*cluster.setup]
    lines += [
        # The ranks of a node share its CPUs, as torchrun's do; srun's own binding would pin
        # each agent (and so all its ranks) to the one CPU of its task.
        f"exec srun --ntasks-per-node=1 --cpus-per-task={cpus} --kill-on-bad-exit=0 "
        + ("--no-kill " if elastic else "")
        + " ".join(shlex.quote(a) for a in worker)
    ]
    return "\n".join(lines) + "\n"


@dataclass
class JobStatus:
    state: str  # Slurm's word (PENDING, RUNNING, ...), or GONE once squeue no longer knows the job
    reason: str = ""
    nodes: str = ""

    @property
    def ended(self) -> bool:
        return self.state in ENDED


def _explain(stderr: str, cluster: Slurm) -> str:
    """sbatch's refusal, with what to do about it."""
    said = " ".join(stderr.replace("sbatch: error: ", "").split())
    low = said.lower()
    if "invalid partition" in low:
        return (
            f"Slurm has no partition {cluster.partition!r} (sbatch: {said}): `sinfo -s` lists the partitions"
        )
    if "node configuration is not available" in low or "node count specification invalid" in low:
        return (
            f"the cluster has no nodes for {cluster.describe()} (sbatch: {said}): `sinfo -N -l` shows "
            "what each node has; ask for fewer nodes, tasks or GPUs"
        )
    if "time limit" in low:
        return f"Slurm refused time={cluster.time!r} (sbatch: {said}): the partition's limit is in `sinfo -s`"
    if "unable to contact slurm controller" in low or "connection refused" in low:
        return f"cannot reach the Slurm controller (sbatch: {said}): is slurmctld up (`scontrol ping`)?"
    return f"sbatch refused the job: {said}"


class SlurmJob:
    """One batch job: submitted, watched through squeue, cancelled.

    A watcher process (``python -m orch.launchers.slurm.job --cancel-when-orphaned``) starts before the
    job is submitted and follows this process through a pidfd (a forked child holding a pipe
    cannot fool it): should this process die before it released the watcher, the watcher
    cancels the job, by id once it was told it, else by its unique name.
    """

    def __init__(self, cluster: Slurm, env: dict[str, str], run_id: str) -> None:
        self.cluster = cluster
        self.env = env
        self.name = job_name(run_id)
        self.job_id = ""
        self.output: Path | None = None
        self.unknown_since: float | None = None  # squeue has failed since then
        self.last_error = ""
        self._watcher: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def submit(self, script: str, run_dir: Path) -> str:
        """sbatch the script (kept as run_dir/job.sh); returns the job id."""
        path = run_dir / "job.sh"
        with own_dir(run_dir) as folder:
            folder.put(path.name, script.encode())  # 0600: sbatch reads it, nobody else
        self._watch()
        argv = ["sbatch", "--parsable", *self.cluster.sbatch_args, str(path)]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, env=self.env)
        except subprocess.TimeoutExpired as e:
            self.cancel()  # the controller may have queued it all the same: by its name
            raise SlurmError(
                f"sbatch did not answer in {COMMAND_TIMEOUT:g}s: is the Slurm controller up?"
            ) from e
        except BaseException:
            self.cancel()  # an interrupt (or no sbatch at all) while submitting
            raise
        if proc.returncode != 0:
            self.release()  # nothing was queued
            raise SlurmError(_explain(proc.stderr or proc.stdout, self.cluster))
        # --parsable prints "jobid" or "jobid;cluster"
        job_id = proc.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            self.cancel()
            raise SlurmError(f"sbatch printed {proc.stdout.strip()!r}, not a job id")
        self.job_id = job_id
        self.output = run_dir / f"slurm-{job_id}.out"
        self._tell(f"job {job_id}\n")
        return job_id

    def _watch(self) -> None:
        env = {k: v for k, v in self.env.items() if k != TOKEN_ENV}  # it needs no secret
        self._watcher = subprocess.Popen(
            [
                *(sys.executable, "-m", "orch.launchers.slurm.job"),
                *("--cancel-when-orphaned", str(os.getpid()), self.name),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # an interrupt of the kernel's group is not for it
        )

    def _tell(self, line: str) -> None:
        watcher = self._watcher
        if watcher is not None and watcher.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                watcher.stdin.write(line.encode())
                watcher.stdin.flush()

    def status(self) -> JobStatus:
        """What squeue says of the job now (UNKNOWN, with the error kept, when it cannot say)."""
        argv = ["squeue", "-h", "--states=all", "-j", self.job_id, "-o", "%T|%r|%N"]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, env=self.env)
        except (OSError, subprocess.TimeoutExpired) as e:
            return self._unknown(f"squeue failed: {e}")
        if proc.returncode != 0:
            if "invalid job id" in proc.stderr.lower():
                return self._known(JobStatus("GONE"))
            return self._unknown(f"squeue failed: {' '.join(proc.stderr.split())[:200]}")
        line = next((ln for ln in proc.stdout.splitlines() if ln.strip()), "")
        if not line:
            return self._known(JobStatus("GONE"))
        state, reason, nodes = [*line.split("|"), "", ""][:3]
        return self._known(JobStatus(state.strip(), reason.strip(), nodes.strip()))

    def _known(self, status: JobStatus) -> JobStatus:
        self.unknown_since, self.last_error = None, ""
        return status

    def _unknown(self, error: str) -> JobStatus:
        if self.unknown_since is None:
            self.unknown_since = time.monotonic()
        self.last_error = error
        return JobStatus("UNKNOWN", error)

    def cancel(self) -> bool:
        """scancel the job (by id, else by its name); True once nothing of it is left queued or
        running. Only then is the watcher released: should scancel fail, it stays, and cancels
        the job when this process ends."""
        target = [self.job_id] if self.job_id else [f"--name={self.name}"]
        for _ in range(3):
            try:
                argv = ["scancel", *target]
                proc = subprocess.run(
                    argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, env=self.env
                )
            except (OSError, subprocess.TimeoutExpired):
                continue
            # "already completing or completed" / "invalid job id": nothing left to cancel
            said = proc.stderr.lower()
            if proc.returncode == 0 or "already" in said or "invalid job id" in said:
                self.release()
                return True
        return False

    def release(self) -> None:
        """The job is over or cancelled: the watcher exits without cancelling anything."""
        with self._lock:
            watcher, self._watcher = self._watcher, None
        if watcher is None:
            return
        if watcher.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                watcher.stdin.write(b"done\n")
                watcher.stdin.close()
        try:
            watcher.wait(5.0)
        except subprocess.TimeoutExpired:
            watcher.kill()
            watcher.wait()

    def output_tail(self, lines: int = 20) -> str:
        return tail(self.output, lines) if self.output is not None else ""

    def view(self, status: JobStatus) -> JobView:
        """What the run's master is told of this job, as ``squeue`` said it (``status``)."""
        return JobView(SCHEDULER, self.job_id, status.state, status.reason, status.nodes)


def _cancel_when_orphaned(launcher: int, name: str, stdin: IO[bytes]) -> int:
    """Follow the launching process (a pidfd) and its word on stdin ("job ID", then "done");
    should it die before "done", scancel its job: by id once known, else by name."""
    import select

    job_id = ""
    try:
        pidfd = os.pidfd_open(launcher)
    except (OSError, AttributeError):
        pidfd = -1
    poller = select.poll()
    poller.register(stdin.fileno(), select.POLLIN)
    if pidfd >= 0:
        poller.register(pidfd, select.POLLIN)
    buffer = b""
    while True:
        events = poller.poll(None if pidfd >= 0 else 200)
        if pidfd < 0 and not _owner_alive(launcher):
            break
        fds = {fd for fd, _ in events}
        if pidfd in fds:
            break  # the launcher is gone
        if stdin.fileno() in fds:
            chunk = os.read(stdin.fileno(), 4096)
            if not chunk:  # closed: only the pidfd can tell now
                poller.unregister(stdin.fileno())
                if pidfd < 0 and not _owner_alive(launcher):
                    break
                continue
            buffer += chunk
            for line in buffer.decode(errors="replace").splitlines():
                if line == "done":
                    return 0
                if line.startswith("job "):
                    job_id = line.split()[1]
            buffer = b""
    target = [job_id] if job_id else [f"--name={name}"]
    for _ in range(3):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            proc = subprocess.run(["scancel", *target], capture_output=True, timeout=COMMAND_TIMEOUT)
            if proc.returncode == 0:
                break
        time.sleep(1.0)
    return 0


def _owner_alive(pid: int) -> bool:
    return process_alive(pid)


RUNNING_POLL = 10.0  # seconds between squeue calls once the job runs (a controller is shared)
UNKNOWN_LIMIT = 300.0  # a queued job squeue cannot tell of for this long fails the run


# The states of a job ended from outside (not by its ranks exiting, not by orch, which has not
# cancelled it yet when they are looked for).
ENDED_FROM_OUTSIDE = ENDED - {"COMPLETED", "FAILED"}


def _ended_by_itself(job: SlurmJob, patience: float) -> JobStatus | None:
    """The job's state once it ended from outside (scancel, its time limit, a node's failure),
    within ``patience`` seconds; None when it did not."""
    deadline = time.monotonic() + patience
    while True:
        status = job.status()
        if status.state in ENDED_FROM_OUTSIDE:
            return status
        if status.ended:
            return None
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.5)


def follow_job(job: SlurmJob, coordinator: Coordinator, closing: threading.Event, *, grace: float) -> None:
    """Show the job's state in the run's until the run ends, fail the run if the job ends
    first, then end the job: let it finish by itself (its host agents exit once told the run
    ended) for a few seconds, then ``scancel`` it. ``closing`` (the run's close()) cancels at once.

    squeue is asked every ``poll_interval`` while the job waits, every RUNNING_POLL seconds
    once it runs (the ranks' heartbeats tell of them meanwhile), and once when the run ends.
    """
    ended_since: float | None = None
    next_poll, poll = 0.0, job.cluster.poll_interval
    try:
        while not closing.is_set() and not coordinator.state.done:
            now = time.monotonic()
            if now >= next_poll:
                status = job.status()
                if status.state != "UNKNOWN":
                    coordinator.set_job(job.view(status))
                elif job.unknown_since is not None and now - job.unknown_since > 5 * poll:
                    coordinator.set_job(job.view(status))  # squeue keeps failing: say so
                    if now - job.unknown_since > UNKNOWN_LIMIT and coordinator.state.value == "PENDING":
                        coordinator.fail(f"Slurm job {job.job_id}: {job.last_error} for {UNKNOWN_LIMIT:g}s")
                        break
                if status.ended:
                    # Over before the run: give its last reports a moment to arrive, then fail the run.
                    ended_since = ended_since or now
                    if now - ended_since > JOB_END_GRACE:
                        why = f" ({status.reason})" if status.reason not in ("", "None") else ""
                        coordinator.fail(
                            f"Slurm job {job.job_id} ended {status.state}{why} before the run did; "
                            f"its output: {job.output}",
                            detail=job.output_tail(40),
                        )
                        break
                    next_poll = now + 0.5
                else:
                    ended_since = None
                    running = status.state in ("RUNNING", "COMPLETING")
                    next_poll = now + (max(poll, RUNNING_POLL) if running else poll)
            coordinator.wait_changed(0.25)  # the run's end is seen at once; squeue only as above
        if not closing.is_set() and coordinator.state.value == "FAILED" and coordinator.fate.weak_cause:
            # A rank failed only because a peer went away: a job cancelled behind the run's
            # back (scancel, its time limit) is the reason, once Slurm says so.
            ended = _ended_by_itself(job, JOB_END_GRACE / 2)
            if ended is not None:
                why = f" ({ended.reason})" if ended.reason not in ("", "None") else ""
                coordinator.fail(
                    f"Slurm job {job.job_id} ended {ended.state}{why} before the run did; "
                    f"its output: {job.output}",
                    detail=job.output_tail(40),
                )
        if not closing.is_set():
            wait_gone(job, grace + JOB_END_GRACE)
    finally:
        job.cancel()
        status = wait_gone(job, JOB_END_GRACE)  # the state it ended in, for the panel and the record
        if status.state != "UNKNOWN":
            coordinator.set_job(job.view(status))


def wait_gone(job: SlurmJob, timeout: float, interval: float = 0.25) -> JobStatus:
    """Poll until the job is over or ``timeout`` passed; the last status."""
    deadline = time.monotonic() + timeout
    status = job.status()
    while not status.ended and time.monotonic() < deadline:
        time.sleep(interval)
        status = job.status()
    return status


if __name__ == "__main__":
    if sys.argv[1:2] == ["--cancel-when-orphaned"] and len(sys.argv) == 4:
        sys.exit(_cancel_when_orphaned(int(sys.argv[2]), sys.argv[3], sys.stdin.buffer))
    sys.exit("usage: python -m orch.launchers.slurm.job --cancel-when-orphaned LAUNCHER_PID JOB_NAME")
