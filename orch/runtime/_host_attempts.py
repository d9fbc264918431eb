"""A host agent's attempts: its ranks started again for each restart the master opens.

``orch worker --nproc-per-node K`` spawns this host's K ranks. With a master that restarts
groups across hosts (``orch master --max-restarts N``, a Slurm run), a failure anywhere ends
every host's ranks, and each agent then waits for the master's word (``SyncHost``, see
:mod:`orch.master.control.hosts`) to spawn its ranks again for the next attempt, with fresh worker
ids; the ranks set up a new rendezvous and resume from the run's last checkpoint. Without
restarts (or with a master too old for ``SyncHost``) the host runs one attempt, as before.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from orch.errors import WorkerError
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.states import EXIT_ABORTED

if TYPE_CHECKING:
    from orch.runtime.agent import HostAgent
    from orch.runtime.spec import WorkerSpec

log = logging.getLogger(__name__)

SYNC_INTERVAL = 1.0  # seconds between an agent's SyncHost calls while its ranks run
WAIT_INTERVAL = 0.25  # ... while it waits for the next attempt
END_GRACE = 5.0  # the master said the attempt is over: its ranks get this long to end themselves
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

RunGroup = Callable[["list[WorkerSpec]", "HostAgent", float, "Callable[[], bool] | None"], int]


class _Watch(threading.Thread):
    """While an attempt's ranks run: tell the master every SYNC_INTERVAL (the host is alive,
    and which ranks it runs), and say when the master has moved past this attempt."""

    def __init__(self, agent: HostAgent, host: str, attempt: int, worker_ids: list[str]) -> None:
        super().__init__(name="orch-host-sync", daemon=True)
        self.agent, self.host, self.attempt, self.worker_ids = agent, host, attempt, worker_ids
        self.running = True
        self.interval = SYNC_INTERVAL
        self._done = threading.Event()
        self._over_since: float | None = None  # when the master first said this attempt is over

    def run(self) -> None:
        while not self._done.is_set():
            try:
                reply = _sync(self.agent, self.host, self.attempt, self.worker_ids, self.running)
            except (grpc.RpcError, TimeoutError, RuntimeError) as e:
                log.debug("host sync failed: %s", e)  # the ranks' own heartbeats judge the master
            else:
                over = reply.action in (pb.HOST_WAIT, pb.HOST_EXIT) or reply.attempt > self.attempt
                if over and self._over_since is None:
                    self._over_since = time.monotonic()
                # The master spaces syncs out as hosts grow (orch.master.control.pace).
                self.interval = max(SYNC_INTERVAL, reply.interval) if reply.interval > 0 else SYNC_INTERVAL
            self._done.wait(self.interval)

    def should_end(self) -> bool:
        """True once the master has said END_GRACE ago that this attempt is over (its ranks
        normally end at their next heartbeat; this ends one that cannot)."""
        return self._over_since is not None and time.monotonic() - self._over_since > END_GRACE

    def stop(self) -> None:
        self._done.set()
        self.join(self.interval + 6.0)


def run_attempts(specs: list[WorkerSpec], agent: HostAgent, poll_interval: float, run_group: RunGroup) -> int:
    """Run this host's ranks for each attempt the master opens; returns the last exit code."""
    host = f"{socket.gethostname()}:{os.getpid()}"
    first = specs[0]
    reply = _first_sync(agent, host, first.register_timeout, first.master)
    if reply is None:  # a master without SyncHost: one attempt
        return run_group(specs, agent, poll_interval, None)
    code, attempt, worker_ids = 0, 0, [s.worker_id for s in specs]
    patience = first.master_timeout or reply.heartbeat_timeout or 30.0
    while True:
        if reply.action == pb.HOST_EXIT:
            # The run's end is this host's: ranks ended after a stop or a success exit 0.
            return 0 if reply.state in (pb.SUCCEEDED, pb.STOPPED, pb.PRUNED) else code or 1
        if reply.action == pb.HOST_START:
            if attempt:  # fresh ids: each attempt's ranks have their own records and logs
                renamed = zip(specs, worker_ids, strict=True)
                specs = [dataclasses.replace(s, worker_id=f"{base}-a{reply.attempt}") for s, base in renamed]
            attempt = reply.attempt
            if reply.restarts:  # the terminal shows each attempt's start on this host
                what = f"starting {len(specs)} ranks for attempt {attempt} of run {reply.run_id}"
                print(f"orch worker: {host}: {what}", file=sys.stderr, flush=True)
            watch = _Watch(agent, host, attempt, [s.worker_id for s in specs])
            watch.start()
            try:
                code = run_group(specs, agent, poll_interval, watch.should_end)
            finally:
                watch.stop()
            if not reply.restarts:
                return code
        reply = _wait_for_word(agent, host, attempt, [s.worker_id for s in specs], patience)
        if reply is None:
            log.warning("host %s: the master fell silent for %gs; exiting", host, patience)
            return code or EXIT_ABORTED


def _sync(
    agent: HostAgent, host: str, attempt: int, worker_ids: list[str], running: bool
) -> pb.HostSyncResponse:
    """One SyncHost call, carrying the deaths of ranks that never registered (once taken)."""
    told = list(agent.unreported)
    reply = agent.sync_host(
        pb.HostSyncRequest(
            host=host, attempt=attempt, worker_ids=worker_ids, running=running, failure="; ".join(told)
        )
    )
    del agent.unreported[: len(told)]
    return reply


def _first_sync(agent: HostAgent, host: str, timeout: float, master: str) -> pb.HostSyncResponse | None:
    """The master's first word to this host (None: a master without SyncHost), trying until
    ``timeout`` while it cannot be reached, as a worker's registration does."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return agent.sync_host(pb.HostSyncRequest(host=host, attempt=0, running=False))
        except grpc.RpcError as e:
            if e.code() is grpc.StatusCode.UNIMPLEMENTED:
                return None
            if e.code() not in RETRYABLE or time.monotonic() > deadline:
                raise WorkerError(f"host agent: the master at {master} refused it: {e.details()}") from e
        except TimeoutError as e:
            if time.monotonic() > deadline:
                raise WorkerError(f"host agent: no answer from the master at {master} in {timeout:g}s") from e
        time.sleep(WAIT_INTERVAL)


def _wait_for_word(
    agent: HostAgent, host: str, attempt: int, worker_ids: list[str], patience: float
) -> pb.HostSyncResponse | None:
    """Ask until the master says to start the next attempt or to exit; None once it has not
    answered for ``patience`` seconds."""
    last_answer = time.monotonic()
    while True:
        try:
            reply = _sync(agent, host, attempt, worker_ids, False)
        except (grpc.RpcError, TimeoutError, RuntimeError) as e:
            if time.monotonic() - last_answer > patience:
                return None
            log.debug("host sync failed: %s", e)
        else:
            last_answer = time.monotonic()
            if reply.action == pb.HOST_EXIT or (reply.action == pb.HOST_START and reply.attempt > attempt):
                return reply
        time.sleep(WAIT_INTERVAL)
