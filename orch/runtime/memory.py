"""What a rank's process holds, read at each heartbeat (never per step): its resident memory,
its CPU share, ``torch.cuda``'s memory when the rank uses a GPU, and the limit it is closest to.

A process's memory is limited by whichever of these it meets first, and this reads each:

- its memory cgroup (v2: ``memory.max``, ``memory.current``, ``memory.events``; v1:
  ``memory.limit_in_bytes``, ``memory.usage_in_bytes``, ``memory.oom_control``), the
  tightest of its own and its ancestors' limits. A cgroup counts its page cache too, which the
  kernel drops before it kills anyone: near the limit, the inactive file pages are not
  counted as used (as ``kubectl top`` does);
- ``RLIMIT_AS``, against the process's address space (Python then raises ``MemoryError``;
  the OOM killer is not involved);
- the machine's memory (``MemTotal`` less ``MemAvailable`` is used).

The limit reported is the one with the least room left, as a share of it. Everything is read
from ``/proc`` and the cgroup files (a few small reads, some tens of microseconds per beat,
on the heartbeat thread); whatever cannot be read is reported as 0, never raised.
:class:`OomCounter` lets the process that watches a worker read, once the worker died,
whether its cgroup counted an out-of-memory kill.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from orch.wire.limits import OWN_METRICS
from orch.wire.model import Points, ProcessStats

log = logging.getLogger(__name__)

PAGE = os.sysconf("SC_PAGE_SIZE")
# A v1 cgroup without a limit says so with a number near 2**63 (rounded down to a page).
V1_NO_LIMIT = 2**62
# Below this share of a cgroup's limit its page cache does not matter: memory.stat (forty
# lines) is read only above it, to leave out the cache the kernel reclaims before an OOM kill.
CACHE_MATTERS = 0.5
POINT_EVERY = 1.0  # seconds between two "rank/memory" points: a metric, not a trace
MB = 1e6


@dataclass(frozen=True)
class Cgroup:
    """A process's memory cgroup: its directory and the files of its version."""

    path: Path
    v2: bool

    @property
    def limit_file(self) -> str:
        return "memory.max" if self.v2 else "memory.limit_in_bytes"

    @property
    def usage_file(self) -> str:
        return "memory.current" if self.v2 else "memory.usage_in_bytes"

    @property
    def events_file(self) -> str:
        return "memory.events" if self.v2 else "memory.oom_control"

    def limit(self, root: Path) -> tuple[int, Path]:
        """The tightest limit of this cgroup and its ancestors up to ``root`` (0: none), and
        the directory that sets it."""
        best, where = 0, self.path
        d = self.path
        while True:
            text = _read(d / self.limit_file)
            if text and text != "max":
                value = _int(text)
                if 0 < value < V1_NO_LIMIT and (best == 0 or value < best):
                    best, where = value, d
            if d == root or root not in d.parents:
                return best, where
            d = d.parent

    def used(self, where: Path, limit: int) -> int:
        """What the limit set at ``where`` counts now, less the inactive page cache near it."""
        used = _int(_read(where / self.usage_file))
        if used >= CACHE_MATTERS * limit:
            key = "inactive_file" if self.v2 else "total_inactive_file"
            used -= _field(_read(where / "memory.stat"), key)
        return max(used, 0)

    def oom_kills(self) -> int:
        """The OOM kills this cgroup counted (v2 counts its descendants' too)."""
        return _field(_read(self.path / self.events_file), "oom_kill")


def find_cgroup(
    pid: int | str = "self", root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc")
) -> Cgroup | None:
    """The memory cgroup of a process, from ``/proc/<pid>/cgroup`` (None: none found)."""
    text = _read(proc / str(pid) / "cgroup")
    unified = ""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if "memory" in controllers.split(","):
            d = root / "memory" / path.lstrip("/")
            if (d / "memory.limit_in_bytes").exists():
                return Cgroup(d, v2=False)
        elif hierarchy == "0" and not controllers:
            unified = path
    if unified:
        d = root / unified.lstrip("/")
        if (d / "memory.max").exists() or (d / "memory.current").exists():
            return Cgroup(d, v2=True)
    return None


class OomCounter:
    """A worker's cgroup's OOM kill count, read when it starts and again when it died."""

    def __init__(self, pid: int, root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc")) -> None:
        self.cgroup = find_cgroup(pid, root, proc)
        self.at_start = self.cgroup.oom_kills() if self.cgroup is not None else 0

    def rose(self) -> bool:
        """True when the cgroup counted an OOM kill since the worker started."""
        return self.cgroup is not None and self.cgroup.oom_kills() > self.at_start


class ProcessReader:
    """Reads this process's :class:`~orch.wire.model.ProcessStats` at each beat, and its metric points."""

    def __init__(
        self,
        cuda_device: int | None = None,
        *,
        root: Path = Path("/sys/fs/cgroup"),
        proc: Path = Path("/proc"),
    ) -> None:
        self.cuda_device = cuda_device
        self.root = root
        self.proc = proc
        self._cpu = self._wall = 0.0
        self._cuda_total = 0
        self._point_at = -1.0
        self._point_step = -1
        self._failed = False

    def read(self) -> ProcessStats:
        """The process now; what cannot be read is left 0 (a reading never fails a beat)."""
        stats = ProcessStats()
        try:
            self._read_into(stats)
        except Exception as e:  # a heartbeat must go out whatever a reading does
            if not self._failed:
                log.warning("reading this process's memory failed (reported as unknown): %r", e)
            self._failed = True
        return stats

    def _read_into(self, stats: ProcessStats) -> None:
        size, rss = (_int(v) * PAGE for v in (_read(self.proc / "self/statm").split()[:2] or ["0", "0"]))
        stats.rss_bytes = rss
        stats.cpu_percent = self._cpu_percent()
        self._read_cuda(stats)
        limits: list[tuple[str, int, int]] = []  # (kind, limit, used)
        cg = find_cgroup("self", self.root, self.proc)
        if cg is not None:
            limit, where = cg.limit(self.root)
            if limit:
                limits.append(("cgroup", limit, cg.used(where, limit)))
            stats.oom_kills = cg.oom_kills()
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY and soft > 0:
            limits.append(("RLIMIT_AS", soft, size))
        info = _read(self.proc / "meminfo")
        total, available = _field(info, "MemTotal") * 1024, _field(info, "MemAvailable") * 1024
        if total:
            limits.append(("machine", total, total - available))
        if limits:
            # The limit with the least room left, as a share of it; the smaller limit on a tie.
            kind, limit, used = max(limits, key=lambda k: (k[2] / k[1], -k[1]))
            stats.limit_kind, stats.memory_limit, stats.limit_used = kind, limit, used

    def points(self, stats: ProcessStats, step: int, now: float) -> list[Points]:
        """The "rank/memory" point (RSS in MB) and, with CUDA, "rank/cuda_memory" (allocated,
        MB): at most one each every :data:`POINT_EVERY` seconds, and only once the step
        moved on, so that the metric has one point per step at most, as a logged one does."""
        if step <= self._point_step or now - self._point_at < POINT_EVERY or not stats.rss_bytes:
            return []
        self._point_at, self._point_step = now, step
        points = [
            Points(name=f"{OWN_METRICS}memory", steps=[step], values=[stats.rss_bytes / MB], times=[now])
        ]
        if stats.cuda_total:
            allocated = stats.cuda_allocated / MB
            points.append(
                Points(name=f"{OWN_METRICS}cuda_memory", steps=[step], values=[allocated], times=[now])
            )
        return points

    def _cpu_percent(self) -> float:
        t = os.times()
        cpu, wall = t.user + t.system, time.monotonic()
        percent = 100.0 * (cpu - self._cpu) / (wall - self._wall) if self._wall else 0.0
        self._cpu, self._wall = cpu, wall
        return max(percent, 0.0)

    def _read_cuda(self, stats: ProcessStats) -> None:
        """torch.cuda's memory, only when the rank initialised CUDA itself: the heartbeat
        thread never starts a CUDA context of its own."""
        torch = sys.modules.get("torch")
        if self.cuda_device is None or torch is None or not torch.cuda.is_initialized():
            return
        dev = self.cuda_device
        stats.cuda_allocated = torch.cuda.memory_allocated(dev)
        stats.cuda_reserved = torch.cuda.memory_reserved(dev)
        stats.cuda_peak = torch.cuda.max_memory_allocated(dev)
        if not self._cuda_total:
            self._cuda_total = torch.cuda.get_device_properties(dev).total_memory
        stats.cuda_total = self._cuda_total


def _read(path: Path) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, ValueError):
        return ""


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def _field(text: str, key: str) -> int:
    """The number after ``key`` in a ``key value`` (or ``key: value kB``) listing; 0 if absent."""
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name.rstrip(":") == key:
            return _int(rest.split()[0]) if rest.split() else 0
    return 0
