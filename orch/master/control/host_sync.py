"""The master's side of ``SyncHost``: what each host agent is told, and when a restart across
hosts may go on (see :mod:`.hosts` for why a restart across machines is a conversation).

A restart across hosts waits until the failed attempt's ranks ended on every host; it gives up
when a host fell silent, or when a rank has no agent that would start it again. Elastic runs
(``min_world_size``) go on without the silent hosts while enough ranks remain: the next
attempt runs on the ranks left. This part only decides: :meth:`HostSync.settle` returns a
:class:`Settled`, and the coordinator carries it out with the run's other parts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from orch.master.control.hosts import HostRecord, HostTable
from orch.master.control.judge import CauseKind, RootCause
from orch.master.control.registry import RankRecord
from orch.master.control.validate import Reject
from orch.wire.limits import MAX_ERROR_LEN
from orch.wire.model import HostAction, HostReport
from orch.wire.states import RunState


@dataclass(frozen=True)
class Settled:
    """What a restart across hosts comes to at one look."""

    then: Literal["wait", "stop", "give_up", "restart"]
    reason: str = ""  # stop: the event that closes the run; give_up: why no restart follows
    resized: str = ""  # elastic: the event of the silent hosts left out on the way ("": none)
    world_size: int = 0  # with ``resized``: the ranks the next attempt runs on


WAIT = Settled("wait")


class HostSync:
    """The host agents of a run, whether they restart its ranks, and the elastic floor."""

    def __init__(self, restart_through_hosts: bool = False, min_world_size: int | None = None) -> None:
        self.hosts = HostTable()
        # Across machines the host agents respawn the ranks of a restart (SyncHost); on one
        # machine the launcher does, and this is False.
        self.restart_through_hosts = restart_through_hosts
        # Elastic: a restart goes on without hosts that fell silent while this many ranks remain.
        self.min_world_size = min_world_size

    def join(self, req: HostReport, attempt: int, world_size: int, now: float) -> HostRecord:
        """Take a host agent's call (checked by ``check_host_sync``); refuse one about an attempt
        the run has not reached, or a host beyond the ranks."""
        if req.attempt > attempt:
            raise Reject(
                "failed_precondition",
                f"host {req.host} speaks of attempt {req.attempt}; the run is at {attempt}",
            )
        if req.host not in self.hosts.hosts and len(self.hosts.hosts) >= world_size:
            # Every host runs a rank at least: more hosts than ranks is not a run's.
            raise Reject(
                "resource_exhausted",
                f"{len(self.hosts.hosts)} hosts already joined a run of {world_size} ranks",
            )
        return self.hosts.seen(req.host, now, req.attempt, req.running, list(req.worker_ids))

    @staticmethod
    def failure(req: HostReport, rec: HostRecord, state: RunState, attempt: int) -> RootCause | None:
        """The failure a host reports (a rank that died before it registered), when it fails the
        live attempt: not one of an older attempt, nor of a run already failing or ended."""
        if req.failure and req.attempt == attempt and not state.done and not state.failing:
            return RootCause(CauseKind.OUTSIDE, f"host {rec.name}: {req.failure[:MAX_ERROR_LEN]}")
        return None

    def action(self, host: str, rec: HostRecord, state: RunState, attempt: int) -> HostAction:
        """What the host's agent does next: exit (the run ended, or the host was left out), wait
        (a restart is under way), start the ranks of ``attempt``, or go on."""
        if state.done or self.hosts.dropped(host):
            return HostAction.EXIT
        if state is RunState.RESTARTING:
            return HostAction.WAIT
        if rec.attempt < attempt and not rec.running:
            return HostAction.START
        return HostAction.CONTINUE

    def settle(
        self,
        state: RunState,
        attempt: int,
        ranks: Sequence[RankRecord],
        now: float,
        timeout: float,
        *,
        stopping: bool,
    ) -> Settled:
        """Where a restart across hosts stands: once the failed ``attempt``'s ranks (``ranks``)
        ended on every host, the next attempt may open; a host silent for ``timeout`` seconds
        is given up on, or left out (elastic); with a stop asked for (``stopping``) no next
        attempt opens. Leaving hosts out changes the table: call it once per look."""
        if state is not RunState.RESTARTING or not self.restart_through_hosts:
            return WAIT
        silent = self.hosts.silent(attempt, now, timeout)
        if stopping:  # no next attempt: wait only for the hosts that still answer
            if any(h not in silent for h in self.hosts.busy(attempt)):
                return WAIT
            return Settled("stop", "stopped while restarting: the next attempt was not started")
        resized, world_size = "", 0
        if silent:
            quiet = [h for h in silent if not h.lost]
            said = "; ".join(
                [f"host {h.name} is gone ({h.lost})" for h in silent if h.lost]
                + (
                    [
                        f"host {self.hosts.names(quiet)} fell silent, no word from its agent for more than "
                        f"{timeout:g}s"
                    ]
                    if quiet
                    else []
                )
            )
            left = sum(len(h.worker_ids) for h in self.hosts.of_attempt(attempt) if h not in silent)
            if self.min_world_size is None or left < self.min_world_size:
                floor = f" (the {left} ranks left are fewer than min_world_size {self.min_world_size})"
                return Settled(
                    "give_up",
                    f"{said}: the group cannot restart without it{floor if self.min_world_size else ''}",
                )
            # Elastic: the next attempt runs on the hosts that are left.
            self.hosts.drop(silent)
            resized, world_size = f"{said}: the next attempt runs on the {left} ranks left", left
        if self.hosts.busy(attempt):
            # Ranks of the failed attempt still run somewhere: they are being torn down.
            return Settled("wait", resized=resized, world_size=world_size)
        managed = self.hosts.managed(attempt)
        orphans = [r for r in ranks if r.worker_id not in managed | self.hosts.gone_workers]
        if orphans:
            named = ", ".join(f"rank {r.rank} (worker {r.worker_id} on {r.host})" for r in orphans[:4])
            reason = (
                f"{named} {'was' if len(orphans) == 1 else 'were'} not started by a host agent "
                "(orch worker --nproc-per-node): nothing would start it again"
            )
            return Settled("give_up", reason, resized, world_size)
        return Settled("restart", resized=resized, world_size=world_size)
