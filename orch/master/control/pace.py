"""How often the ranks beat: the master spaces heartbeats out as its callers grow.

Each call costs the master's one event loop the same, whatever it carries, so what loads it is
calls per second: ranks / interval for ranks that call it themselves, hosts / interval for host
agents (one call per host for all its ranks). The launch's ``heartbeat_interval`` (0.25 s) holds
while that stays under :data:`MAX_CALLS_PER_SECOND`; past it, every caller is asked (in its
heartbeat's reply) to beat less often, so that the rate stays there. What a rank's beat
carries then arrives later, by at most the interval: its progress and points in the panel, a
stop, the stacks. The interval never passes an eighth of the heartbeat timeout, so that a
lost rank is still told from a slow one.
"""

from __future__ import annotations

HEARTBEAT_TIMEOUT = 30.0  # seconds without a beat before a rank counts as lost, by default
HEARTBEAT_INTERVAL = 0.25  # seconds between a rank's beats, by default
MAX_CALLS_PER_SECOND = 256.0  # heartbeat calls a second the master is paced for


def beat_interval(callers: int, base: float, heartbeat_timeout: float) -> float:
    """The seconds between a caller's heartbeats, for ``callers`` callers: ``base`` while the
    calls stay under :data:`MAX_CALLS_PER_SECOND`, then longer, up to ``heartbeat_timeout / 8``."""
    paced = max(base, callers / MAX_CALLS_PER_SECOND)
    return min(paced, max(base, heartbeat_timeout / 8))


SYNCS_PER_SECOND = 128.0  # SyncHost calls a second (one per host agent, 1 s apart at most)
SYNC_INTERVAL = 1.0


def sync_interval(hosts: int, heartbeat_timeout: float) -> float:
    """Seconds between a host agent's SyncHost calls while its ranks run: 1 s while the hosts
    stay under :data:`SYNCS_PER_SECOND`, then longer, up to ``heartbeat_timeout / 8`` (a host
    that fell silent is still told within its timeout)."""
    paced = max(SYNC_INTERVAL, hosts / SYNCS_PER_SECOND)
    return min(paced, max(SYNC_INTERVAL, heartbeat_timeout / 8))
