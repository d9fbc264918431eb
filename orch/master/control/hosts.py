"""The host agents of a run across machines, as the master sees them.

On one machine the launcher that spawned the ranks restarts them. Across machines nothing of
the master's can: each host's agent (``orch worker --nproc-per-node K``, one per node in a
Slurm job) spawns its own ranks, so a restart is a conversation. The agents call
``SyncHost`` every second or so, saying which ranks they started for which attempt and
whether those still run; once the failed attempt's ranks have ended on every host, the master
opens the next attempt and each agent starts its ranks again. An agent that stops calling is
a host that is gone.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class HostRecord:
    host: str  # the agent's id: "hostname:pid"
    last_seen: float  # the master's clock
    attempt: int = 0
    running: bool = False
    worker_ids: frozenset[str] = frozenset()
    lost: str = ""  # what the launcher knows of the host's end (its node gone), said in its stead

    @property
    def name(self) -> str:
        """The host's name, without the agent's pid."""
        return self.host.rpartition(":")[0] or self.host


class HostTable:
    """Every host agent that called, keyed by its id."""

    def __init__(self) -> None:
        self.hosts: dict[str, HostRecord] = {}
        self.gone: set[str] = set()  # hosts left out of the run (elastic): told to exit if they call
        self.gone_workers: set[str] = set()  # the ranks they had started

    def drop(self, hosts: list[HostRecord]) -> None:
        for h in hosts:
            self.hosts.pop(h.host, None)
            self.gone.add(h.host)
            self.gone_workers |= h.worker_ids

    def lose(self, host: str, why: str) -> HostRecord | None:
        """The launcher knows ``host`` is gone (``why``): it is silent from now on, and its ranks
        run no more. None for a host that never called."""
        rec = self.hosts.get(host)
        if rec is not None:
            rec.lost, rec.last_seen, rec.running = why, float("-inf"), False
        return rec

    def dropped(self, host: str) -> bool:
        return host in self.gone

    def seen(self, host: str, now: float, attempt: int, running: bool, worker_ids: list[str]) -> HostRecord:
        if host in self.gone:
            return HostRecord(host, now, attempt, running, frozenset(worker_ids))  # not kept
        rec = self.hosts.get(host)
        if rec is None:
            rec = self.hosts[host] = HostRecord(host, now)
        rec.last_seen = now
        if attempt >= rec.attempt:  # a late call about an older attempt changes nothing
            if attempt > rec.attempt or worker_ids:
                rec.worker_ids = frozenset(worker_ids)
            rec.attempt, rec.running = attempt, running
        return rec

    def of_attempt(self, attempt: int) -> list[HostRecord]:
        """The hosts that started ranks for ``attempt``."""
        return [h for h in self.hosts.values() if h.attempt == attempt]

    def busy(self, attempt: int) -> list[HostRecord]:
        """The hosts whose ranks of ``attempt`` still run."""
        return [h for h in self.of_attempt(attempt) if h.running]

    def silent(self, attempt: int, now: float, timeout: float) -> list[HostRecord]:
        """The hosts of ``attempt`` that have not called for ``timeout`` seconds."""
        return [h for h in self.of_attempt(attempt) if now - h.last_seen > timeout]

    def managed(self, attempt: int) -> set[str]:
        """The worker ids some host agent started for ``attempt``."""
        return {w for h in self.of_attempt(attempt) for w in h.worker_ids}

    def names(self, hosts: list[HostRecord]) -> str:
        return ", ".join(sorted(h.name for h in hosts))
