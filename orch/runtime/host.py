"""The host side of ``orch worker --nproc-per-node K``: K ranks spawned on this host, their
heartbeats relayed through one host agent, each attempt's ranks watched and restarted as
the master says (:mod:`orch.runtime._host_attempts`). A rank process never imports this.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable

from orch.runtime._host_attempts import run_attempts
from orch.runtime.agent import HostAgent
from orch.runtime.joining import advertised_address
from orch.runtime.owner import Owner
from orch.runtime.spec import WorkerSpec
from orch.runtime.worker import spawn_main
from orch.wire.auth import token_from_env
from orch.wire.states import EXIT_ABORTED, describe_exit

log = logging.getLogger(__name__)


def run_local_group(specs: list[WorkerSpec], poll_interval: float = 0.1) -> int:
    """Run several workers of one host as spawned processes (``orch worker --nproc-per-node K``).

    The ranks reach the master through a host agent in this process (:mod:`orch.runtime.agent`),
    which sends their heartbeats in one call per interval and reports a rank whose process
    died without reporting. Returns the first non-zero exit code (0 when all succeeded).
    When one process fails the others are ended too (the master aborts them anyway); Ctrl-C
    or SIGTERM ends them all.
    """
    first = specs[0]
    agent = HostAgent(
        first.master,
        ranks=len(specs),
        window=first.heartbeat_interval,
        token=token_from_env(first.token),
        tls_ca=first.tls_ca,
        tls_server_name=first.tls_server_name,
    )
    agent.start()
    try:
        return run_attempts(specs, agent, poll_interval, _run_group)
    except HostInterrupted as e:
        return e.code
    finally:
        agent.stop()
        log.info("host agent: %d heartbeats in %d calls to the master", agent.beats, agent.batches)


REPORT_TIMEOUT = 10.0  # seconds to tell the master of ranks that died without a word


KILL_GRACE = 5.0  # seconds ranks told to end (SIGTERM) get before SIGKILL


class HostInterrupted(Exception):
    """SIGTERM or Ctrl-C ended this host's ranks: the host agent exits, whatever the master says."""

    def __init__(self, code: int) -> None:
        super().__init__(f"interrupted (exit {code})")
        self.code = code


def _run_group(
    specs: list[WorkerSpec],
    agent: HostAgent,
    poll_interval: float,
    should_end: Callable[[], bool] | None = None,
) -> int:
    """Spawn one attempt's ranks and watch them until all have exited; returns the first
    non-zero exit code as a shell shows it (0: all succeeded). Raises HostInterrupted on
    SIGTERM or Ctrl-C, once the ranks are gone."""
    import multiprocessing as mp

    import cloudpickle

    ctx = mp.get_context("spawn")
    owner = Owner()
    procs = []
    for spec in specs:
        spec.owner = owner
        # The ranks dial the host agent, on this host: it verified the master (TLS) for them.
        spec.trust_master = spec.trust_master or spec.tls_ca is not None
        # The address the other hosts' ranks reach this one on: the route to the master, found
        # before the ranks are pointed at the agent on 127.0.0.1 (which would give loopback).
        spec.advertise_addr = advertised_address(spec)
        spec.master, spec.tls_ca, spec.tls_server_name = agent.address, None, None
        p = ctx.Process(target=spawn_main, args=(cloudpickle.dumps(spec),), name=f"orch-{spec.worker_id}")
        p.start()
        procs.append(p)
    ended_at: float | None = None  # when this process ended the ranks: their deaths are its doing
    interrupted = 0

    def end_all() -> None:
        nonlocal ended_at
        if ended_at is None:
            ended_at = time.monotonic()
        for p in procs:
            if p.exitcode is None:
                p.terminate()

    def on_sigterm(*_: object) -> None:
        nonlocal interrupted
        interrupted = interrupted or 143
        end_all()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    code = 0
    try:
        while True:
            try:
                # Exits are read before the loop may end: a killed rank and the peer its death
                # broke can both be gone within one poll, and the killed one must be reported.
                running = any(p.exitcode is None for p in procs)
                failed = [(spec, p.exitcode) for spec, p in zip(specs, procs, strict=True) if p.exitcode]
                if failed and code == 0:
                    code = _shell_status(failed[0][1])
                    if ended_at is None:
                        _report_deaths(agent, failed)
                    end_all()
                if not running:
                    break
                if should_end is not None and ended_at is None and should_end():
                    log.warning("the master has moved past this attempt: ending this host's ranks")
                    end_all()
                if ended_at is not None and time.monotonic() - ended_at > KILL_GRACE:
                    for p in procs:  # a rank stopped, or deaf to SIGTERM: it must not hold up the run
                        if p.exitcode is None and p.pid is not None:
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(p.pid, signal.SIGCONT)
                            p.kill()
                time.sleep(poll_interval)
            except KeyboardInterrupt:
                interrupted = interrupted or 130
                end_all()
    finally:
        for p in procs:
            p.join(KILL_GRACE)
            if p.exitcode is None:
                p.kill()
                p.join()
        signal.signal(signal.SIGTERM, previous)
    code = code or next((_shell_status(p.exitcode) for p in procs if p.exitcode), 0)
    if interrupted:
        raise HostInterrupted(code or interrupted)
    return code


def _report_deaths(agent: HostAgent, failed: list[tuple[WorkerSpec, int]]) -> None:
    """Tell the master of ranks that died without a word; one deadline for them all (a master
    that cannot be reached costs it once). A rank that never registered is left for the
    agent's next SyncHost to report (``agent.unreported``)."""
    deadline = time.monotonic() + REPORT_TIMEOUT
    for spec, exitcode in failed:  # a rank that reported itself keeps its own report
        if exitcode == EXIT_ABORTED:
            continue  # it ended itself: its master aborted it or went silent
        if not agent.report_exit(spec.worker_id, exitcode, max(0.5, deadline - time.monotonic())):
            if agent.registered(spec.worker_id):
                continue  # the master could not be reached: its heartbeat timeout will tell
            agent.unreported.append(
                f"the process of worker {spec.worker_id} on {socket.gethostname()} exited with "
                f"{describe_exit(exitcode)} before it registered"
            )


def _shell_status(exitcode: int) -> int:
    """multiprocessing's exit code (negative: killed by that signal) as a shell reports it."""
    return exitcode if exitcode >= 0 else 128 - exitcode
