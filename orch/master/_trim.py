"""The memory a connection flood leaves, given back to the system (glibc's ``malloc_trim``).

A gRPC server holds about 17 KiB per open connection (its HTTP/2 transport and read buffer), so
a local user who opens connections up to the master's cap (18,976 under an open-file limit of
20,000) takes it from 60 MB to 370 MB. When the connections go, gRPC frees that memory, but
glibc keeps it: the freed pages lie between small objects gRPC keeps for reuse (an event
handle for each connection it held at once), where glibc's own trim, at the top of its heap
only, never reaches. The master's RSS stayed at the flood's peak, and the next floods added to
it (370, 523, 568 MB after three; ``benchmarks/RESULTS.md``, connection_flood).

``malloc_trim(0)`` hands every whole free page back. A thread looks at the allocator's bytes in
use (``mallinfo2``) every few seconds and trims when they fell by ``DROP`` from their highest
since its last trim, and again at each look while they keep falling: as a flood's connections
go, never while nothing was freed (a trim after a flood at the cap took up to 150 ms, on that
thread, not the event loop's). The pages that hold the kept handles stay, about 6.5 KiB for
each connection the flood held (180 MB after a flood at that cap); the next flood reuses them,
so floods in a row no longer add up. One thread serves every master of the process (a sweep
runs several): they share the allocator. Where the C library is not glibc 2.33 or later
(macOS, musl) there is nothing to call and nothing runs.

    RSS MB ▲      a flood at the cap           its connections closed
       370 │        ┌───────────────────────┐· · · · · · · · · · · ·  without: kept, and added to
           │       /                        │
       180 │      /                         └──┐ trimmed: all but the kept handles' pages
        60 │─────/                             └─────────────────────
           └─────────────────────────────────────────────────────────▶ time
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Protocol

log = logging.getLogger(__name__)

CHECK_INTERVAL = 5.0  # seconds between looks at the allocator
DROP = 32 * 2**20  # bytes in use freed since the highest mark that make a trim worth it
FOLLOW = 2**20  # bytes freed since a trim that make another, while they keep falling


class Allocator(Protocol):
    def in_use(self) -> int:
        """Bytes the program holds in the allocator's heaps."""
        ...

    def trim(self) -> None:
        """Give the heaps' free pages back to the system."""
        ...


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",  # bytes in use in the heaps (not the chunks mapped on their own)
            "fordblks",
            "keepcost",
        )
    ]


class Glibc:
    """glibc's allocator, through ``mallinfo2`` (glibc 2.33 and later) and ``malloc_trim``."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._mallinfo2 = libc.mallinfo2
        self._mallinfo2.restype = _MallInfo2
        self._mallinfo2.argtypes = []
        self._trim = libc.malloc_trim
        self._trim.restype = ctypes.c_int
        self._trim.argtypes = [ctypes.c_size_t]

    @classmethod
    def load(cls) -> Glibc | None:
        """This process's glibc, or None when its C library has no such calls."""
        try:
            return cls(ctypes.CDLL(None))
        except (OSError, AttributeError):
            return None

    def in_use(self) -> int:
        return int(self._mallinfo2().uordblks)

    def trim(self) -> None:
        self._trim(0)


class Watermark:
    """When to trim: the bytes in use fell by ``drop`` from their highest since the last trim;
    then again at each look that finds them fallen by ``follow`` more, while a flood's
    connections are still going (its last ones would otherwise stay, up to ``drop``)."""

    def __init__(self, drop: int = DROP, follow: int = FOLLOW) -> None:
        self.drop = drop
        self.follow = follow
        self.highest = 0
        self.trimmed: int | None = None  # bytes in use at the last trim, while they keep falling

    def trim_now(self, in_use: int) -> bool:
        self.highest = max(self.highest, in_use)
        falling = self.trimmed is not None and self.trimmed - in_use >= self.follow
        if not falling and self.highest - in_use < self.drop:
            self.trimmed = None  # they stopped falling: the next trim waits for a drop again
            return False
        self.highest = self.trimmed = in_use
        return True


class Trimmer:
    """Looks at ``allocator`` every ``interval`` seconds on a thread of its own; trims when due."""

    def __init__(
        self, allocator: Allocator, interval: float = CHECK_INTERVAL, drop: int = DROP, follow: int = FOLLOW
    ) -> None:
        self.allocator = allocator
        self.interval = interval
        self.watermark = Watermark(drop, follow)
        self.trims = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="orch-trim", daemon=True)

    def start(self) -> Trimmer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()

    def check(self) -> bool:
        """One look: trims (and says so) when the bytes in use fell far enough."""
        in_use = self.allocator.in_use()
        if not self.watermark.trim_now(in_use):
            return False
        self.allocator.trim()
        self.trims += 1
        log.debug("gave the allocator's free pages back (%d MiB in use)", in_use >> 20)
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.check()


_lock = threading.Lock()
_users = 0
_running: Trimmer | None = None


def hold() -> None:
    """A master started: the process's trimmer runs (started by the first)."""
    global _users, _running
    with _lock:
        _users += 1
        if _running is None:
            allocator = Glibc.load()
            if allocator is not None:
                _running = Trimmer(allocator).start()


def release() -> None:
    """A master stopped: the last one stops the trimmer."""
    global _users, _running
    with _lock:
        _users = max(0, _users - 1)
        trimmer, _running = (_running, None) if _users == 0 else (None, _running)
    if trimmer is not None:
        trimmer.stop()


def running() -> Trimmer | None:
    """The process's trimmer, while a master holds it (and the C library has one)."""
    return _running
