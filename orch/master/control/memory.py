"""What a rank's memory says, from its heartbeats: whether it grows steadily (a leak), whether
it nears a limit, and whether a SIGKILL was the out-of-memory killer's.

Each beat carries the process's RSS and the limit it is closest to (the worker reads them, see
:mod:`orch.runtime.memory`). A leak is judged from one RSS sample a second over the last
minute, never from a few beats: an ordinary run's RSS grows in its first steps (the optimizer's
state, the allocator's pools, lazy imports) and then wobbles as garbage is collected. So the
first :data:`WARMUP` seconds of training are not sampled, and growth counts as steady only
when the RSS rose in most seconds of at least :data:`LEAK_MIN_SPAN` seconds, by at least
:data:`LEAK_MIN_GROWTH` bytes. A one-off jump (a cache filled once) rises in one second only.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from orch._text import size_text
from orch.wire.model import ProcessStats
from orch.wire.ranks import RankView

SAMPLE_EVERY = 1.0  # seconds between two RSS samples kept (beats come four times a second)
LEAK_WINDOW = 60.0  # seconds of samples a leak is judged on
WARMUP = 5.0  # seconds from a rank's first step during which its growth is expected
LEAK_MIN_SPAN = 10.0  # seconds of samples, at least, before growth counts as steady
# How much it must have grown over the window: below this, wobble and slow caches (a few MB a
# minute) would be called leaks; a leak this slow takes hours to matter and is seen later.
LEAK_MIN_GROWTH = 64e6
# The share of seconds in which the RSS rose: a leak rises in nearly every one, while a healthy
# process's RSS goes up and down with each step's garbage.
LEAK_RISING_SHARE = 0.7
# Near a limit: the share of it in use. A process at 90% of its limit is one large batch away
# from the OOM killer (or a MemoryError); the warning comes while there is time to act.
NEAR_LIMIT = 0.9
# The GPU: torch's caching allocator keeps what it once used reserved, so a healthy run often
# holds most of the device; only the last few percent are a warning.
NEAR_GPU_LIMIT = 0.95
# A SIGKILL whose rank's last beat (a quarter second before) showed this share of its limit in
# use is the OOM killer's: nothing else in orch's reach sends SIGKILL to a rank that full.
OOM_NEAR = 0.8

LIMIT_NAMES = {
    "cgroup": "cgroup limit",
    "RLIMIT_AS": "address-space limit (RLIMIT_AS)",
    "machine": "machine's memory",
}


@dataclass
class MemoryWindow:
    """A rank's RSS samples over the last :data:`LEAK_WINDOW` seconds, what its last beat said
    of its limit, and which warnings were told."""

    samples: deque[tuple[float, int]] = field(
        default_factory=lambda: deque(maxlen=int(LEAK_WINDOW / SAMPLE_EVERY) + 1)
    )
    training_since: float | None = None
    limit_used: int = 0  # what its limit counted at its last beat
    oom_kills: int = 0  # OOM kills its cgroup had counted at its last beat
    leak: str = ""  # the leak's note: once judged, it stays for the attempt
    told: set[str] = field(default_factory=set)  # warnings put in the event log

    def take(self, rec: RankView, p: ProcessStats, now: float) -> None:
        """One beat's reading, into the rank's record and the samples."""
        rec.rss_bytes, rec.cpu_percent = p.rss_bytes, p.cpu_percent
        rec.cuda_allocated, rec.cuda_reserved, rec.cuda_peak = p.cuda_allocated, p.cuda_reserved, p.cuda_peak
        rec.cuda_total, rec.memory_limit, rec.limit_kind = p.cuda_total, p.memory_limit, p.limit_kind
        self.limit_used, self.oom_kills = p.limit_used, p.oom_kills
        if rec.step <= 0 or not p.rss_bytes:
            return
        if self.training_since is None:
            self.training_since = now
        if now - self.training_since < WARMUP or (self.samples and now - self.samples[-1][0] < SAMPLE_EVERY):
            return
        self.samples.append((now, p.rss_bytes))

    def judge(self, rec: RankView) -> tuple[str, list[tuple[str, str]]]:
        """The rank's memory note now, and the warnings not told before ((key, text) each)."""
        notes: list[tuple[str, str]] = []
        leak = self.growth(rec)
        if leak:
            self.leak = leak
        if self.leak:
            notes.append(("leak", self.leak))
        if rec.memory_limit and self.limit_used >= NEAR_LIMIT * rec.memory_limit:
            share = _share(self.limit_used, rec.memory_limit)
            notes.append(("limit", f"near its {_limit_name(rec.limit_kind)}: {share}"))
        if rec.cuda_total and rec.cuda_reserved >= NEAR_GPU_LIMIT * rec.cuda_total:
            share = _share(rec.cuda_reserved, rec.cuda_total)
            notes.append(("gpu", f"GPU memory nearly full: {share} reserved by torch"))
        news = [(k, text) for k, text in notes if k not in self.told]
        self.told.update(k for k, _ in news)
        return "; ".join(text for _, text in notes), news

    def growth(self, rec: RankView) -> str:
        """The note of a steady growth over the window ("" when there is none)."""
        s = self.samples
        if len(s) < 2:
            return ""
        (t0, first), (t1, last) = s[0], s[-1]
        span = t1 - t0
        if span < LEAK_MIN_SPAN or last - first < LEAK_MIN_GROWTH:
            return ""
        rises = sum(b[1] > a[1] for a, b in zip(s, list(s)[1:], strict=False))
        if rises < LEAK_RISING_SHARE * (len(s) - 1):
            return ""
        rate = (last - first) / span
        note = (
            f"memory grows steadily: RSS {size_text(first)} to {size_text(last)} in {span:.0f}s "
            f"(+{size_text(rate)}/s)"
        )
        room = rec.memory_limit - self.limit_used
        if rec.memory_limit and room > 0:
            limit = f"{_limit_name(rec.limit_kind)} ({size_text(rec.memory_limit)})"
            note += f"; at this rate its {limit} is reached in {_duration(room / rate)}"
        return note


def oom_cause(rec: RankView, window: MemoryWindow, counted: bool) -> str:
    """Why a rank killed by SIGKILL was the OOM killer's ("" when nothing says so): its last
    beat was near its limit (:data:`OOM_NEAR`), or its cgroup counted the kill (``counted``,
    read by the process that saw it die)."""
    near = bool(rec.memory_limit) and window.limit_used >= OOM_NEAR * rec.memory_limit
    if not near and not counted:
        return ""
    where = f"RSS {size_text(rec.rss_bytes)} at its last beat" if rec.rss_bytes else "no beat read its memory"
    if rec.memory_limit:
        limit, used = size_text(rec.memory_limit), size_text(window.limit_used)
        where += f"; {_limit_name(rec.limit_kind)} {limit}, {used} in use"
    if counted:
        where += "; its cgroup counted the kill"
    return f"killed by the out-of-memory killer ({where})"


def _limit_name(kind: str) -> str:
    return LIMIT_NAMES.get(kind, f"{kind} limit" if kind else "limit")


def _share(used: int, limit: int) -> str:
    return f"{size_text(used)} of {size_text(limit)} in use ({used / limit:.0%})"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
