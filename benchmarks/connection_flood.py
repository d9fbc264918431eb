"""A connection flood from one local process: the master's memory and reachability through it.

A real master in its own process (``python -m orch.cli master --world-size 1 --port 0
--no-dashboard --linger 0``, waiting for its worker, token and all) is flooded three times in a
row, as a local user who can reach its TCP port would: a process of its own
(``benchmarks/_flood.py``) opens connections one after the other as fast as it can, up to the
master's cap (its open-file limit - 1,024) plus 200, each sending the HTTP/2 preface and an
empty SETTINGS frame (what every gRPC client sends first), and holds them. The master closes
the ones past its cap at once and the idle ones after its idle close (30 s); ``--hold`` ends a
flood sooner by closing the connections left. A fourth flood's connections send nothing: the
master's handshake timeout (5 s) closes them.

Throughout, this script samples the master's RSS (psutil, every 0.1 s) and its open files, and
probes it every 0.25 s as a stranger's ``orch status`` would: a fresh connection
(``grpc.use_local_subchannel_pool``) and one ``GetState`` with the token and a 1 s deadline.
Each flood records the RSS before it, its peak, and ``--after`` seconds (60) after the
flood's last connection went; the memory the master held per connection at the peak; how
long new connections were refused; and how soon after the flood a probe got through.

The full run does it all twice, each on a fresh master: as orch serves (``trimmed``), and with
the master's giving back of freed memory (``orch/master/_trim.py``) turned off in that process
(``untrimmed``: the master as it was before it had one). ``--quick`` runs the first only, with
the master's open-file limit at 1,400 (a cap of 376).

    .venv/bin/python benchmarks/connection_flood.py            # full run (~13 min), writes RESULTS.md
    .venv/bin/python benchmarks/connection_flood.py --quick    # tiny, prints only
"""

from __future__ import annotations

import json
import math
import re
import resource
import secrets
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common as c
import grpc
import psutil

from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire._proto import orchestrator_pb2_grpc as pb_grpc

NAME = "connection_flood"
FLOOD = c.HERE / "_flood.py"
TOKEN = secrets.token_urlsafe(16)
AUTH = (("authorization", f"Bearer {TOKEN}"),)
PROBE_EVERY = 0.25
PROBE_DEADLINE = 1.0
EXTRA = 200  # connections past the cap: the cap is surely reached
GOAL_AFTER_MB = 50.0  # RSS 60 s after the last flood <= RSS before the first + this
GOAL_RATCHET_MB = 10.0  # RSS after the last flood <= RSS after the first + this
IDLE_S = 30.0  # orch/wire/auth.py IDLE_CONNECTION_SECONDS
HANDSHAKE_S = 5.0  # orch/master/server.py HANDSHAKE_TIMEOUT_MS
# The master with its trimmer turned off: ``python -c UNTRIMMED master ...`` is ``orch master ...``.
UNTRIMMED = (
    "import sys; from orch.master import _trim; _trim.hold = _trim.release = lambda: None; "
    "from orch.cli import main; sys.exit(main())"
)


class Master:
    """``orch master`` in its own process; killed (with its tree) on exit."""

    def __init__(self, run_root: Path, fd_limit: int = 0, *, trimmed: bool = True) -> None:
        cmd = [c.PYTHON, *(["-m", "orch.cli"] if trimmed else ["-c", UNTRIMMED]), "master"]
        cmd += ["--world-size", "1", "--port", "0", "--no-dashboard", "--linger", "0"]
        cmd += ["--heartbeat-timeout", "600", "--run-root", str(run_root)]
        self.proc = subprocess.Popen(
            cmd,
            env=c.bench_env(ORCH_TOKEN=TOKEN),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=(lambda: _limit_files(fd_limit)) if fd_limit else None,
        )
        self.address = ""

    def __enter__(self) -> Master:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            m = re.search(r"serving on (\S+);", raw.decode(errors="replace"))
            if m:
                self.address = m.group(1)
                break
        if not self.address:
            raise RuntimeError("the master did not print its address")
        # Its output is drained from here on: a full pipe must not block it.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        c.kill_tree(self.proc.pid)
        self.proc.wait(10)

    def cap(self) -> int:
        """The master's connection cap, as orch/wire/net.py's ``connection_cap`` computes it there."""
        soft, _ = psutil.Process(self.proc.pid).rlimit(psutil.RLIMIT_NOFILE)
        limit = 2**20 if soft == psutil.RLIM_INFINITY else soft
        return max(256, min(limit - 1024, 65536))


def _limit_files(n: int) -> None:
    """Soft and hard: the master cannot raise it, and its cap is ``n`` - 1,024."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


class Watch:
    """The master's RSS every 0.1 s and its open files every 0.5 s, and a probe every 0.25 s."""

    def __init__(self, pid: int, address: str) -> None:
        self.proc = psutil.Process(pid)
        self.address = address
        self.rss: list[tuple[float, float]] = []  # (time, MB)
        self.fds: list[tuple[float, int]] = []
        self.probes: list[tuple[float, bool, str]] = []  # (time sent, answered OK, code)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._sample, self._probe)]

    def __enter__(self) -> Watch:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)

    def _sample(self) -> None:
        n = 0
        while not self._stop.wait(0.1):
            now = time.monotonic()
            try:
                self.rss.append((now, self.proc.memory_info().rss / 2**20))
                if n % 5 == 0:
                    self.fds.append((now, self.proc.num_fds()))
            except psutil.NoSuchProcess:
                return
            n += 1

    def _probe(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            self.probes.append((sent, *probe(self.address)))
            self._stop.wait(max(0.0, sent + PROBE_EVERY - time.monotonic()))

    def rss_now(self) -> float:
        return float(self.proc.memory_info().rss / 2**20)

    def rss_between(self, t0: float, t1: float) -> list[float]:
        return [mb for t, mb in self.rss if t0 <= t <= t1]

    def fds_between(self, t0: float, t1: float) -> list[int]:
        return [n for t, n in self.fds if t0 <= t <= t1]

    def probes_between(self, t0: float, t1: float) -> list[tuple[float, bool, str]]:
        return [p for p in self.probes if t0 <= p[0] <= t1]


def probe(address: str) -> tuple[bool, str]:
    """One GetState on a connection of its own, as a stranger's ``orch status`` makes it."""
    with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        try:
            pb_grpc.OrchestratorStub(ch).GetState(
                pb.GetStateRequest(skip_series=True), metadata=AUTH, timeout=PROBE_DEADLINE
            )
        except grpc.RpcError as e:
            return False, e.code().name
    return True, "OK"


@dataclass
class Flood:
    """One flood, and what the master did through it."""

    connections: int
    mode: str = "preface"  # what each connection sends: the HTTP/2 preface and SETTINGS, or nothing
    rss_before: float = 0.0
    rss_peak: float = 0.0
    rss_after: float = 0.0
    fds_before: int = 0
    fds_peak: int = 0
    open_s: float = 0.0  # from the first connection to the last opened
    failed_to_open: int = 0
    refused: int = 0  # closed by the master within a second of opening: past the cap
    idle_closed: list[float] = field(default_factory=list)  # ages at which the master closed the others
    closed_by_us: int = 0
    unreachable_s: float = 0.0  # the longest run of failed probes, from its first to the next OK
    failed_probes: int = 0
    probes: int = 0
    back_after_s: float = float("nan")  # from the flood's end to the first OK probe sent after it
    codes: dict[str, int] = field(default_factory=dict)

    @property
    def held(self) -> int:
        return self.fds_peak - self.fds_before

    @property
    def kib_per_connection(self) -> float:
        return (self.rss_peak - self.rss_before) * 1024 / max(1, self.held)


def _unreachable(probes: list[tuple[float, bool, str]], until: float) -> float:
    """The longest span from a failed probe's send to the next OK one's (or ``until``)."""
    longest, since = 0.0, None
    for t, ok, _ in probes:
        if not ok and since is None:
            since = t
        elif ok and since is not None:
            longest, since = max(longest, t - since), None
    if since is not None:
        longest = max(longest, until - since)
    return longest


def flood(watch: Watch, master: Master, f: Flood, *, hold: float, after: float) -> Flood:
    f.rss_before = watch.rss_now()
    f.fds_before = psutil.Process(master.proc.pid).num_fds()
    start = time.monotonic()
    proc = subprocess.Popen(
        [c.PYTHON, str(FLOOD), master.address, str(f.connections), f.mode],
        env=c.bench_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        opened = json.loads(proc.stdout.readline())
        f.open_s, f.failed_to_open = opened["last"] - opened["first"], opened["failed"]
        try:
            proc.wait(max(0.0, opened["last"] + hold - time.monotonic()))  # ends once all are closed
        except subprocess.TimeoutExpired:
            proc.stdin.write("close\n")
            proc.stdin.flush()
        ended = json.loads(proc.stdout.readline())
        proc.wait(30)
    finally:
        c.kill_tree(proc.pid)
    ages = [age for _, age in ended["closed_by_master"]]
    f.refused = sum(1 for a in ages if a < 1.0)
    f.idle_closed = sorted(a for a in ages if a >= 1.0)
    f.closed_by_us = ended["closed_by_us"]
    end = max([ended["at"] if f.closed_by_us else 0.0, *(t for t, _ in ended["closed_by_master"])])
    time.sleep(max(0.0, end + after - time.monotonic()))
    f.rss_after = watch.rss_now()
    f.rss_peak = max([f.rss_before, *watch.rss_between(start, end + after)])
    f.fds_peak = max([f.fds_before, *watch.fds_between(start, end)])
    during = watch.probes_between(start, end)
    f.probes, f.failed_probes = len(during), sum(1 for p in during if not p[1])
    f.unreachable_s = _unreachable(watch.probes_between(start, end + after), end + after)
    for _, _, code in during:
        f.codes[code] = f.codes.get(code, 0) + 1
    back = [t for t, ok, _ in watch.probes_between(end, end + after) if ok]
    f.back_after_s = back[0] - end if back else float("nan")
    return f


def _line(name: str, f: Flood) -> str:
    idle = f"idle-closed {len(f.idle_closed)} at {c.median(f.idle_closed):.1f} s" if f.idle_closed else ""
    return (
        f"  {name}: {f.connections} connections opened in {f.open_s:.1f} s ({f.failed_to_open} failed), "
        f"master held {f.held} at the peak, refused {f.refused}, {idle} closed by us {f.closed_by_us}; "
        f"RSS {f.rss_before:.0f} -> peak {f.rss_peak:.0f} -> after {f.rss_after:.0f} MB "
        f"({f.kib_per_connection:.1f} KiB per connection); probes failed {f.failed_probes}/{f.probes} "
        f"{f.codes}, unreachable for {f.unreachable_s:.1f} s, back {f.back_after_s:.2f} s after the flood"
    )


@dataclass
class Case:
    """Floods in a row on one fresh master, then a silent one."""

    name: str
    trimmed: bool
    cap: int = 0
    rss_before: float = 0.0  # before the first flood
    floods: list[Flood] = field(default_factory=list)
    silent: Flood = field(default_factory=lambda: Flood(0, "tcp"))

    @property
    def met(self) -> bool:
        return self.floods[-1].rss_after <= self.rss_before + GOAL_AFTER_MB


def run_case(case: Case, args: Any) -> Case:
    with (
        tempfile.TemporaryDirectory(prefix="orch-flood-") as d,
        Master(Path(d), args.fd_limit, trimmed=case.trimmed) as m,
        Watch(m.proc.pid, m.address) as watch,
    ):
        case.cap = m.cap()
        n = args.connections or case.cap + EXTRA
        time.sleep(3.0)  # the probes' own connections and calls, before "before"
        case.rss_before = watch.rss_now()
        for i in range(args.floods):
            case.floods.append(flood(watch, m, Flood(n), hold=args.hold, after=args.after))
            print(_line(f"{case.name} flood {i + 1}", case.floods[-1]), flush=True)
        hold = max(args.hold, HANDSHAKE_S + 3)
        case.silent = flood(watch, m, Flood(n, "tcp"), hold=hold, after=5.0)
        print(_line(f"{case.name} silent flood", case.silent), flush=True)
    return case


def main() -> None:
    p = c.parser(NAME, __doc__)
    p.add_argument("--connections", type=int, default=0, help="connections per flood (default: cap + 200)")
    p.add_argument("--floods", type=int, default=3, help="floods in a row, each sending the preface")
    p.add_argument(
        "--hold", type=float, default=45.0, help="seconds a flood holds what the master has not closed"
    )
    p.add_argument("--after", type=float, default=60.0, help="seconds after a flood its RSS is read")
    p.add_argument(
        "--fd-limit", type=int, default=0, help="the master's open-file limit (default: this process's)"
    )
    args = p.parse_args()
    if args.quick:
        args.hold, args.after = 1.0, 3.0
        args.fd_limit = args.fd_limit or 1400  # a cap of 376
    started = c.start()
    cases = [Case("trimmed", True)] + ([] if args.quick else [Case("untrimmed", False)])
    try:
        for case in cases:
            run_case(case, args)
    finally:
        c.kill_all_children()
    case = cases[0]
    first, last = case.floods[0], case.floods[-1]
    c.emit(NAME, "rss_before_mb", f"{case.rss_before:.0f}", cap=case.cap, connections=first.connections)
    c.emit(NAME, "rss_peak_mb", f"{max(f.rss_peak for f in case.floods):.0f}")
    c.emit(NAME, "rss_after_mb", f"{last.rss_after:.0f}", after_s=f"{args.after:g}", met=case.met)
    c.emit(NAME, "kib_per_connection", f"{first.kib_per_connection:.1f}")
    c.emit(NAME, "unreachable_s", f"{max(f.unreachable_s for f in case.floods):.1f}")
    c.emit(NAME, "silent_closed_s", f"{c.median(case.silent.idle_closed or [math.nan]):.1f}")
    c.check_no_leftovers(NAME)
    if not args.quick:
        _write(args, cases, started)


def _rss_row(case: Case, args: Any) -> c.Row:
    floods = case.floods
    return c.Row(
        f"{len(floods)} floods of {floods[0].connections:,} connections in a row (cap {case.cap:,}), "
        f"{case.name}: master RSS {args.after:g} s after the last, against before the first",
        f"<= before + {GOAL_AFTER_MB:g} MB" if case.trimmed else "- (the master without its trim)",
        f"{case.rss_before:.0f} MB before, {floods[-1].rss_after:.0f} MB after "
        f"(after each: {', '.join(f'{f.rss_after:.0f}' for f in floods)} MB; peaks "
        f"{', '.join(f'{f.rss_peak:.0f}' for f in floods)} MB)",
        case.met if case.trimmed else None,
    )


def _write(args: Any, cases: list[Case], started: float) -> None:
    trimmed, untrimmed = cases
    floods, silent = trimmed.floods, trimmed.silent
    first, last = floods[0], floods[-1]
    idle = [a for f in floods for a in f.idle_closed]
    rows = [
        _rss_row(trimmed, args),
        c.Row(
            "floods in a row do not add up: RSS after the last against after the first",
            f"<= + {GOAL_RATCHET_MB:g} MB",
            f"{first.rss_after:.0f} MB after the first, {last.rss_after:.0f} MB after the last "
            f"(untrimmed: {untrimmed.floods[0].rss_after:.0f}, {untrimmed.floods[-1].rss_after:.0f} MB)",
            last.rss_after <= first.rss_after + GOAL_RATCHET_MB,
        ),
        c.Row(
            "memory the master holds per connection: the first flood's peak over before, per connection",
            "-",
            f"{first.kib_per_connection:.1f} KiB ({first.held:,} held: "
            f"+{first.rss_peak - first.rss_before:.0f} MB)",
            None,
        ),
        c.Row(
            "a new connection's GetState: during a flood, and after it",
            "refused while the flood holds the cap (by design); back within 1 s of its end",
            f"refused for up to {max(f.unreachable_s for f in floods):.1f} s in a row; back "
            f"{max(f.back_after_s for f in floods):.2f} s after the end at worst",
            all(f.back_after_s <= 1.0 for f in floods),
        ),
        c.Row(
            "a held connection that sent its preface and never a call is closed after",
            f"{IDLE_S:g} s (`IDLE_CONNECTION_SECONDS`)",
            f"median {c.median(idle):.1f} s ({min(idle):.1f}-{max(idle):.1f} s) of {len(idle):,}"
            if idle
            else f"none: the floods ended first (--hold {args.hold:g})",
            max(idle) <= IDLE_S + 5 if idle else None,
        ),
        c.Row(
            "a held connection that never sent its HTTP/2 preface is closed after (its age counts "
            "from its connect: later ones waited in the listen backlog before the master took them)",
            f"{HANDSHAKE_S:g} s (`HANDSHAKE_TIMEOUT_MS`)",
            f"the first at {min(silent.idle_closed):.1f} s, median {c.median(silent.idle_closed):.1f} s, "
            f"the last at {max(silent.idle_closed):.1f} s, of {len(silent.idle_closed):,}"
            if silent.idle_closed
            else "none: the flood ended first",
            None,
        ),
        _rss_row(untrimmed, args),
    ]
    commit = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=c.ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "orch"], cwd=c.ROOT, capture_output=True, text=True
    ).stdout
    head = (
        f"Measured at commit `{commit}`"
        + (" (orch/ had uncommitted changes)" if dirty else "")
        + f"; each case on a fresh master: {len(floods)} floods of {first.connections:,} connections "
        "each sending the HTTP/2 preface and SETTINGS, then one (silent) of connections that send "
        f"nothing; a flood holds for at most {args.hold:g} s; the RSS after is read {args.after:g} s "
        "after the flood's last connection went (5 s for the silent one). `untrimmed` is the master "
        "with `orch/master/_trim.py` turned off, as it was before it had it. See the script's "
        "docstring for the method."
    )
    body = [head, ""]
    for case in cases:
        body += [f"**{case.name}** (RSS before the first flood: {case.rss_before:.0f} MB)", ""]
        body += [_table(case), ""]
    c.write_section(args.out, NAME, "\n".join(body), rows, started)


def _table(case: Case) -> str:
    return c.table(
        [
            "flood",
            "opened in",
            "held at the peak",
            "refused at once",
            "closed by the master (median age)",
            "RSS before MB",
            "peak MB",
            "after MB",
            "KiB per connection",
            "probes failed",
            "refused in a row",
            "back after the end",
        ],
        [
            (
                name,
                f"{f.open_s:.1f} s",
                f"{f.held:,}",
                f"{f.refused:,}",
                f"{len(f.idle_closed):,} ({c.median(f.idle_closed):.1f} s)" if f.idle_closed else "0",
                f"{f.rss_before:.0f}",
                f"{f.rss_peak:.0f}",
                f"{f.rss_after:.0f}",
                f"{f.kib_per_connection:.1f}",
                f"{f.failed_probes}/{f.probes}",
                f"{f.unreachable_s:.1f} s",
                c.fmt_s(f.back_after_s),
            )
            for name, f in [*((str(i + 1), f) for i, f in enumerate(case.floods)), ("silent", case.silent)]
        ],
    )


if __name__ == "__main__":
    main()
