"""The notebook panel: time per poll and per redraw, and bytes per poll, against history length.

A :class:`~orch.master.coordinator.Coordinator` served by a real ``MasterServer`` in this
process holds 8 ranks' ``loss`` series, fed with heartbeats as the gRPC master takes them
(``coordinator.accept_heartbeat``, chunks of 50k points), grown to 1k, 100k and 1M points
per rank. At each length a new :class:`orch.views.panel.Panel` (real widgets, no kernel
attached) attaches over gRPC:

- initial poll: the full ``GetState`` a panel makes when it opens (time and size; a
  reply above the master's 16 MiB message limit fails, and the panel then gets the state
  in-process, as ``Run.state()`` does, so the rest can still be measured);
- steady state, ``--iterations`` times: 20 new points per rank arrive, then one
  incremental poll (``GetState`` after the cursor, folded into the ``StateMirror``:
  time and serialized reply size) and one ``Panel._redraw()`` (downsampling + matplotlib
  PNG + widget updates). The panel's own polling thread is parked (interval 1 h) after its
  first poll, so the benchmark drives these steps itself.

    .venv/bin/python benchmarks/panel_redraw.py            # full run, writes RESULTS.md
    .venv/bin/python benchmarks/panel_redraw.py --quick    # tiny, prints only
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common as c

NAME = "panel_redraw"
RANKS = 8
NEW_POINTS = 20
TARGET_REDRAW_MS = 50.0


@dataclass
class Level:
    points: int
    initial_ok: bool = True
    initial_error: str = ""
    initial_s: float = 0.0
    initial_bytes: int = 0
    initial_replies: int = 0
    poll_s: list[float] = field(default_factory=list)
    poll_bytes: list[int] = field(default_factory=list)
    redraw_s: list[float] = field(default_factory=list)
    downsample_s: list[float] = field(default_factory=list)
    feed_s: float = 0.0
    held: int = 0  # points per rank the panel holds (the master may keep only the newest)


class Source:
    """The panel's view of a run whose master this process serves."""

    def __init__(self, address: str) -> None:
        self.address = address

    def connect(self) -> Any:
        from orch.wire.client import MasterClient

        return MasterClient(self.address, timeout=60.0)

    def stop(self, reason: str = "") -> Any:
        from orch.wire.states import RunState

        return RunState.RUNNING

    def log_files(self) -> dict[str, Path]:
        return {}

    def final_state(self) -> Any:
        return None


def _feed(coord: Any, start: int, end: int, chunk: int = 50_000) -> None:
    """Append steps ``start..end-1`` of every rank's loss series."""
    import numpy as np

    from orch.wire._proto import orchestrator_pb2 as pb

    t0 = time.time()
    for lo in range(start, end, chunk):
        hi = min(end, lo + chunk)
        steps = np.arange(lo, hi)
        values = (2.0 / np.sqrt(1.0 + steps)).tolist()
        times = (t0 + steps * 1e-3).tolist()
        steps_l = steps.tolist()
        for rank in range(RANKS):
            req = pb.HeartbeatRequest(run_id=coord.run_id, worker_id=f"w{rank}", step=hi, total_steps=10**7)
            req.series.append(pb.Series(name="loss", steps=steps_l, values=values, times=times))
            _, write = coord.accept_heartbeat(req)  # as the gRPC master takes it
            if write is not None:
                write()


def _in_process(coord: Any) -> Any:
    """The whole state of the coordinator, without RPCs (in as many replies as it takes)."""
    from orch.wire.client import StateMirror

    mirror = StateMirror()
    while True:
        reply = coord.snapshot(mirror.cursor)
        mirror.apply(reply)
        if not getattr(reply, "more", False):
            return mirror


def _state_bytes(coord: Any) -> int:
    """Bytes of all the replies that carry the coordinator's whole state."""
    from orch.wire.client import StateMirror

    mirror, total = StateMirror(), 0
    while True:
        reply = coord.snapshot(mirror.cursor)
        total += reply.ByteSize()
        mirror.apply(reply)
        if not getattr(reply, "more", False):
            return total


def measure(level: Level, coord: Any, address: str, iterations: int, have: int) -> int:
    import numpy as np

    from orch.views.panel import Panel
    from orch.views.rank_plot import downsample
    from orch.views.waiting import wait_for

    source = Source(address)
    client = source.connect()
    panel = Panel(source, interval=3600.0, client=client)
    try:
        # The panel's thread makes the initial (full) poll and first redraw, then parks.
        assert wait_for(lambda: panel.redraws >= 1, 600.0), "the panel never drew"
        time.sleep(0.2)
        # Time the initial catch-up separately, with the same client: every GetState reply a
        # panel opening now needs (orch may split the history over several bounded replies).
        from orch.wire.client import StateMirror

        probe = StateMirror()
        t = time.perf_counter()
        try:
            while True:
                reply = client.get_state(probe.cursor)
                level.initial_bytes += reply.ByteSize()
                level.initial_replies += 1
                probe.apply(reply)
                if not getattr(reply, "more", False):
                    break
            level.initial_s = time.perf_counter() - t
        except Exception as e:  # a reply above a message size limit: RESOURCE_EXHAUSTED
            level.initial_ok = False
            level.initial_error = str(e).splitlines()[0][:200]
            level.initial_bytes = _state_bytes(coord)
        del probe
        if panel.last_error or not panel.mirror.series:
            panel.mirror = _in_process(coord)  # as Run.state() does
            panel.last_error = ""
        for _ in range(iterations):
            _feed(coord, have, have + NEW_POINTS)
            have += NEW_POINTS
            t0 = time.perf_counter()
            reply = client.get_state(panel.mirror.cursor)
            panel.mirror.apply(reply)
            t1 = time.perf_counter()
            panel._redraw()
            t2 = time.perf_counter()
            level.poll_s.append(t1 - t0)
            level.poll_bytes.append(reply.ByteSize())
            level.redraw_s.append(t2 - t1)
            assert panel.mirror.last_points == RANKS * NEW_POINTS, panel.mirror.last_points
            t3 = time.perf_counter()
            for buf in panel.mirror.series.values():
                downsample(buf.steps, buf.values, panel._plot.width_px)
            level.downsample_s.append(time.perf_counter() - t3)
        level.held = min(len(b) for b in panel.mirror.series.values())
        assert np.all(
            panel.mirror.series[(0, "loss")].steps[-NEW_POINTS:] == np.arange(have - NEW_POINTS, have)
        )
    finally:
        panel.close()
    return have


def main() -> None:
    p = c.parser(NAME, __doc__)
    p.add_argument("--iterations", type=int, default=20, help="steady-state poll+redraw cycles per length")
    p.add_argument("--lengths", default="1000,100000,1000000", help="points per rank")
    args = p.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.quick:
        args.iterations, lengths = 3, [1000, 20000]
    started = c.start()
    import matplotlib

    matplotlib.use("Agg")
    from orch.master.control.plan import RunPlan
    from orch.master.coordinator import Coordinator
    from orch.master.server import MasterServer
    from orch.wire._proto import orchestrator_pb2 as pb

    coord = Coordinator(RunPlan(RANKS, heartbeat_timeout=1e6), run_id="bench-panel")
    for i in range(RANKS):
        coord.register(pb.RegisterRequest(worker_id=f"w{i}", host="h", pid=i + 1, rendezvous_port=29500))
    for i in range(RANKS):
        assert coord.can_start(pb.CanStartTrainingRequest(run_id=coord.run_id, worker_id=f"w{i}")).ready
    server = MasterServer(coord, port=0).start()
    levels: list[Level] = []
    have = 0
    try:
        for n in lengths:
            level = Level(n)
            t = time.perf_counter()
            _feed(coord, have, n)
            have = n
            level.feed_s = time.perf_counter() - t
            have = measure(level, coord, server.address, args.iterations, have)
            levels.append(level)
            print(
                f"  {n:>9,} points/rank: initial poll "
                + (f"{level.initial_s * 1e3:.0f} ms" if level.initial_ok else "FAILED")
                + f" ({level.initial_bytes / 2**20:.1f} MiB in {level.initial_replies} replies), "
                f"poll {c.median(level.poll_s) * 1e3:.2f} ms {c.median(level.poll_bytes):.0f} B, "
                f"redraw {c.median(level.redraw_s) * 1e3:.1f} ms "
                f"(downsample {c.median(level.downsample_s) * 1e3:.1f} ms)",
                flush=True,
            )
    finally:
        server.stop(grace=0.2)
    for lv in levels:
        c.emit(
            NAME,
            f"redraw_ms_{lv.points}",
            f"{c.median(lv.redraw_s) * 1e3:.2f}",
            poll_ms=f"{c.median(lv.poll_s) * 1e3:.2f}",
            poll_bytes=f"{c.median(lv.poll_bytes):.0f}",
            initial_poll="ok" if lv.initial_ok else "failed",
            initial_mib=f"{lv.initial_bytes / 2**20:.2f}",
            initial_replies=lv.initial_replies,
            held=lv.held,
        )
    c.check_no_leftovers(NAME)
    if args.quick:
        return
    by = {lv.points: lv for lv in levels}
    rows = []
    if 100_000 in by:
        r = c.median(by[100_000].redraw_s) * 1e3
        rows.append(
            c.Row(
                "panel redraw, 8 ranks x 100k points",
                f"<= {TARGET_REDRAW_MS:g} ms",
                f"{r:.1f} ms",
                r <= TARGET_REDRAW_MS,
            )
        )
    sizes = [c.median(lv.poll_bytes) for lv in levels]
    spread = max(sizes) - min(sizes)
    flat = spread <= 0.05 * min(sizes)
    rows.append(
        c.Row(
            "bytes per incremental poll (8 x 20 new points), 1k → 1M points/rank",
            "independent of history length",
            " → ".join(f"{s:.0f} B" for s in sizes),
            flat,
        )
    )
    failed = [lv for lv in levels if not lv.initial_ok]
    rows.append(
        c.Row(
            "panel opening on a long run (initial catch-up poll)",
            "- (no target)",
            "fails at "
            + ", ".join(f"{lv.points:,} points/rank ({lv.initial_bytes / 2**20:.0f} MiB)" for lv in failed)
            if failed
            else "works at every length ("
            + ", ".join(
                f"{lv.points:,}: {lv.initial_s * 1e3:.0f} ms, {lv.initial_replies} replies" for lv in levels
            )
            + ")",
            None if not failed else False,
        )
    )
    detail = [
        (
            f"{lv.points:,}",
            f"{lv.held:,}",
            f"{lv.initial_s * 1e3:.0f} ms" if lv.initial_ok else "**fails**",
            f"{lv.initial_bytes / 2**20:.2f}" + (f" ({lv.initial_replies})" if lv.initial_ok else ""),
            f"{c.median(lv.poll_s) * 1e3:.2f}",
            f"{c.median(lv.poll_bytes):.0f}",
            f"{c.median(lv.redraw_s) * 1e3:.1f}",
            f"{c.percentile(lv.redraw_s, 90) * 1e3:.1f}",
            f"{c.median(lv.downsample_s) * 1e3:.1f}",
        )
        for lv in levels
    ]
    errors = "".join(f"\n- {lv.points:,} points/rank: `{lv.initial_error}`" for lv in failed)
    body = "\n".join(
        [
            f"{RANKS} ranks, one `loss` series each; {args.iterations} steady-state cycles per length, each "
            f"adding {NEW_POINTS} points per rank; plot 720x320 px (downsampled to ≤ 2 points per pixel "
            "column). Medians (redraw p90 beside).",
            "",
            c.table(
                [
                    "points per rank",
                    "held by the panel",
                    "initial poll (catch-up)",
                    "initial MiB (replies)",
                    "incremental poll ms",
                    "bytes per poll",
                    "redraw ms",
                    "redraw p90 ms",
                    "of which downsampling ms",
                ],
                detail,
            ),
            "",
            "The initial poll: every `GetState` reply a panel opening on the run needs to catch up "
            "(one reply carrying the whole in-memory history, or several bounded ones where the master "
            "splits it: `more` set), over gRPC, folded into a `StateMirror`; MiB is their total size."
            + (f" Failures:{errors}" if errors else ""),
            "",
            "'held by the panel': points per rank in the panel's mirror after the run; below the history "
            "length when the master keeps only the newest points of each series in memory.",
        ]
    )
    c.write_section(args.out, NAME, body, rows, started)


if __name__ == "__main__":
    sys.exit(main())
