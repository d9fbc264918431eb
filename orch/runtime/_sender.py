"""The worker's heartbeat thread: batches logged points into heartbeats, obeys commands.

``log()`` runs in the training thread and only appends to a bounded deque (no lock, no
I/O), so it never waits on the network. The thread wakes every ``interval`` seconds,
drains the deque into one columnar ``HeartbeatRequest`` of at most
:data:`~orch.wire.limits.MAX_VALUES_PER_BEAT` values (a backlog goes in several beats, each
one the master takes) and keeps points it could not send for the next try. A beat the
master refuses for what it carries is not sent again: its points are dropped and counted,
and the next beat says how many and why (``dropped_points``, ``dropped_reason``), so the
rank's record shows it. When the master has not answered for ``master_timeout`` seconds
the worker is ended: an orphaned rank must not train on alone. Unless the rank watches the
process its master runs in (``owner_watched``: a launch's ranks on this machine end when that
process does): a master that is silent while that process lives is busy, not gone (a notebook
cell in a long C call holds the GIL the master shares), so the rank trains on and keeps its
points for when the master answers again.

A rank that is ended (its launcher's SIGTERM, the master's ABORT) first says its last words
(:meth:`HeartbeatSender.last_words`): the points it logged until then go out, within
:data:`ABORT_FLUSH` seconds, with the step they reach; nothing is sent after them. Only a
rank killed outright loses what it logged since its last beat (an interval's points), and the
master's record of it says so.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from orch.runtime._children import say_last_words
from orch.runtime.memory import ProcessReader
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire._proto import orchestrator_pb2_grpc as pb_grpc
from orch.wire.codec import encode
from orch.wire.limits import MAX_REASON_LEN, MAX_VALUES_PER_BEAT
from orch.wire.model import Stack, StepTiming

if TYPE_CHECKING:
    from orch.runtime._ddp_steps import Iterations

log = logging.getLogger(__name__)

Point = tuple[int, float, dict[str, float]]
ABORT_FLUSH = 1.0  # seconds an ended rank spends sending the points it logged (a launcher's grace is 1.5)
# Seconds a rank done training waits for a busy master whose process lives (see owner_watched)
# to take its last points and its end.
BUSY_MASTER_WAIT = 120.0


class HeartbeatSender:
    def __init__(
        self,
        stub: pb_grpc.OrchestratorStub,
        *,
        run_id: str,
        worker_id: str,
        interval: float = 0.25,
        master_timeout: float = 10.0,
        max_queue: int = 1_000_000,
        max_batch: int = 100_000,
        on_stop: Callable[[int], None],
        on_abort: Callable[[str], None],
        local_master: bool = False,
        owner_watched: bool = False,
    ) -> None:
        self._stub = stub
        self.run_id = run_id
        self.worker_id = worker_id
        self.interval = interval
        self.base_interval = interval
        self.master_timeout = master_timeout
        self.max_queue = max_queue
        self.max_batch = max_batch
        self._on_stop = on_stop
        self._on_abort = on_abort
        # A master on this host whose port refuses connections is gone for good: its
        # workers end at once instead of waiting out master_timeout.
        self.local_master = local_master
        self.owner_watched = owner_watched  # the master's process is watched: silence is not death
        self._said_busy = False
        self._refused = 0
        self._queue: deque[Point] = deque()
        self._retry: pb.HeartbeatRequest | None = None  # built once, sent again until acknowledged
        self.step = 0  # set by ctx.steps()
        self.hold_after = 0  # a sweep's rung: ctx.steps waits after this step (see wait_gate)
        self.last_hold = 0  # the last rung the master named (it stays when a STOP clears hold_after)
        self.told_stop = False  # the master said STOP
        self.answered = False  # the master answered a beat: what it says at the start is known
        self.logged = 0  # steps done by what ctx.log() was given: its highest step + 1
        self.counts_steps = False  # ctx.steps() counts this rank's steps (from step 0)
        # Its DDP models' training iterations: the step of a rank whose code counts none.
        self.iterations: Iterations | None = None
        self.total_steps = 0
        self.dropped = 0
        self.dropped_reason = ""  # why points were last dropped, told with the next beat
        self.note = ""  # a warning of the rank's code about its run (Context.warn), until the master has it
        self._untold = False  # points were dropped since the master last heard the count
        self.timing: Callable[[], StepTiming | None] | None = None  # ctx's step times, taken per beat
        # The training thread's stack, taken when the master asks (see orch.runtime._stack).
        self.stack_of: Callable[[], Stack] | None = None
        self._stack: Stack | None = None  # taken, to go in the next beat
        self.process: ProcessReader | None = None  # this process's memory and CPU, read per beat
        self.watch: Callable[[], None] | None = None  # looked at before each beat (orch.runtime._world)
        self._closing = threading.Event()
        self._beat_lock = threading.Lock()  # one heartbeat at a time: the thread's or a flush's
        self._obey = True
        self._final: int | None = None  # the step its last words said: nothing goes after them
        self._last: deque[Point] = deque()  # the points its last words send
        self._last_ok = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="orch-heartbeat", daemon=True)

    def start(self) -> HeartbeatSender:
        """Beat from now on; and on SIGTERM, this process's last words are this rank's points
        (see :meth:`last_words`), until :meth:`close`."""
        self._last_ok = time.monotonic()
        self._thread.start()
        say_last_words(self.last_words)
        return self

    def log(self, step: int, values: dict[str, float]) -> None:
        """Queue one point; called from the training thread, never blocks. The point is queued
        before it counts in :attr:`progress` (see :meth:`last_words`)."""
        if len(self._queue) >= self.max_queue:
            self.dropped += 1
            if not self._untold:
                self.dropped_reason = (
                    f"ctx.log's queue held {self.max_queue:,} points not yet sent: points were logged "
                    "faster than the heartbeats carry them, or the master could not be reached"
                )
                self._untold = True
        else:
            self._queue.append((step, time.time(), values))
        if step >= self.logged:
            self.logged = step + 1

    @property
    def progress(self) -> int:
        """The steps this rank has done: ``ctx.steps``' count, or one past the last step logged.

        Both count the same way: ``ctx.steps(n)`` ends at ``n`` having yielded ``0 .. n-1``,
        and a loop that logged steps ``0 .. n-1`` has done ``n`` too. A rank whose code counts
        neither (it logs nothing, or only rank 0 logs) has done its DDP models' training
        iterations (:mod:`orch.runtime._ddp_steps`): 5 of them, 5 steps.
        """
        if self._final is not None:
            return self._final  # its last words said it: what it did after is not told
        done = max(self.step, self.logged)
        iterations = self.iterations
        if iterations is None:
            return done
        if done or self.counts_steps:
            # The code counts its steps: they are its progress, as ever; DDP's count comes off.
            self.iterations = None
            iterations.close()
            return done
        return iterations()

    @property
    def pending(self) -> int:
        """Logged points still queued, plus the values of the batch awaiting a retry."""
        retry = self._retry
        waiting = sum(len(s.steps) for s in retry.series) if retry is not None else 0
        return len(self._queue) + waiting

    def ignore_commands(self) -> None:
        """Keep sending, but no longer act on STOP/ABORT or on the master going silent."""
        self._obey = False

    def flush(self, timeout: float = 10.0) -> bool:
        """Send everything queued so far, from the calling thread; True when the master has it all."""
        deadline = time.monotonic() + timeout
        while self._unsent:
            if time.monotonic() > deadline:
                return False
            if not self._beat():
                time.sleep(0.05)
        return True

    def hear(self) -> None:
        """One beat now, from the calling thread: what the master says (a sweep's first rung)
        is known before the loop's first step, not a beat interval later. A beat already in
        flight brings the same answer: the caller does not queue behind it."""
        if self._stub is not None and self._beat_lock.acquire(blocking=False):
            try:
                self._beat_locked()
            finally:
                self._beat_lock.release()

    def wait_gate(self, step: int, timeout: float) -> bool:
        """At a sweep's rung (``hold_after == step``): send this rank's points, and ask again until
        the sweep decided: the master moves the rung on, or says STOP. False after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while self.hold_after == step and not self.told_stop:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005 if self._beat() else 0.05)
        return True

    def close(self, timeout: float | None = None) -> bool:
        """Send what is queued and stop the thread; True when everything went out. ``timeout``:
        seconds to wait for the thread (default 5; a busy master's while, see owner_watched)."""
        self._closing.set()
        if timeout is None:
            timeout = BUSY_MASTER_WAIT + 5.0 if self.owner_watched else 5.0
        self._thread.join(timeout)
        say_last_words(None, unless=self.last_words)
        return not self._unsent

    def last_words(self, timeout: float = ABORT_FLUSH) -> bool:
        """This rank ends now (its launcher's SIGTERM): send the points it logged so far, within
        ``timeout`` seconds, from the calling thread, obeying no command the replies bring
        (a beat in flight finishes first). True when the master has them all.

        What the training thread logs from here on is neither sent nor counted: the beats that
        go say the step their points reach, so the rank's step and its history agree."""
        deadline = time.monotonic() + timeout
        self._obey = False
        if not self._beat_lock.acquire(timeout=timeout):
            return False
        try:
            return self._say_last_words(deadline)
        finally:
            self._beat_lock.release()

    def _say_last_words(self, deadline: float) -> bool:
        """:meth:`last_words`, the beat lock held (the master's ABORT is answered from the beat)."""
        if self._final is None:
            # The progress first: each point it counts is queued already (log() queues, then
            # counts); those queued meanwhile raise the step with them, and later ones go nowhere.
            step = self.progress
            self._last, self._queue = self._queue, deque()
            self._final = max([step] + [p[0] + 1 for p in self._last])
        while self._unsent:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            request = self._retry if self._retry is not None else self._request(self._drain(self._last))
            if not self._send(request, left) and self._retry is not None:
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        return True

    @property
    def _unsent(self) -> bool:
        """Points wait to be sent (after its last words, only theirs), or the master has not yet
        heard of the last ones dropped."""
        queue = self._queue if self._final is None else self._last
        return bool(queue) or self._retry is not None or self._untold or bool(self.note)

    def _loop(self) -> None:
        while not self._closing.wait(self.interval):
            if self.watch is not None:
                self.watch()
            self._beat()
        if self.watch is not None:
            self.watch()  # a last look: a run shorter than a beat is judged too
        # A busy master whose process lives (owner_watched) is waited for: the points go to it.
        wait = self.interval * 4 + 2.0 if not self.owner_watched else BUSY_MASTER_WAIT
        deadline = time.monotonic() + wait
        while self._unsent and time.monotonic() < deadline:
            if not self._beat():
                time.sleep(0.05)

    def _drain(self, q: deque[Point] | None = None) -> list[Point]:
        """The oldest points of ``q`` (default: the queue), at most ``max_batch`` of them holding
        at most MAX_VALUES_PER_BEAT values (one point always goes, whatever it holds: ctx.log
        caps its names)."""
        if q is None:
            q = self._queue
        points: list[Point] = []
        values = 0
        while q and len(points) < self.max_batch:
            values += len(q[0][2])
            if values > MAX_VALUES_PER_BEAT and points:
                break
            points.append(q.popleft())
        return points

    def _request(self, points: list[Point]) -> pb.HeartbeatRequest:
        reached = self.progress  # the step these points reach (see last_words)
        columns: dict[str, tuple[list[int], list[float], list[float]]] = {}
        for step, t, values in points:
            for name, value in values.items():
                col = columns.get(name)
                if col is None:
                    col = columns[name] = ([], [], [])
                col[0].append(step)
                col[1].append(value)
                col[2].append(t)
        series = []
        for name, (steps, column, times) in columns.items():
            try:
                series.append(pb.Series(name=name, steps=steps, values=column, times=times))
            except (TypeError, ValueError):  # ctx.log checks its input: only a direct caller gets here
                kept, bad = salvage(name, steps, column, times)
                series.append(kept)
                self.dropped += bad
        request = pb.HeartbeatRequest(
            run_id=self.run_id,
            worker_id=self.worker_id,
            step=reached,
            total_steps=self.total_steps,
            dropped_points=self.dropped,
            dropped_reason=self.dropped_reason,
            series=series,
            note=self.note,
        )
        timing = self.timing() if self.timing is not None else None
        if timing is not None:
            request.timing.CopyFrom(encode(timing))
        if self._stack is not None:
            request.stack.CopyFrom(encode(self._stack))
            self._stack = None
        if self.process is not None:
            stats = self.process.read()
            request.process.CopyFrom(encode(stats))
            request.series.extend(encode(p) for p in self.process.points(stats, reached, time.time()))
        return request

    def _master_gone(self, e: grpc.RpcError) -> bool:
        """Twice in a row "connection refused" from a master on this host: nothing listens there now."""
        if not self.local_master or e.code() is not grpc.StatusCode.UNAVAILABLE:
            return False
        if "refused" not in (e.details() or "").lower():
            self._refused = 0
            return False
        self._refused += 1
        return self._refused >= 2

    def _beat(self) -> bool:
        with self._beat_lock:
            return self._beat_locked()

    def _beat_locked(self) -> bool:
        if self._final is not None:
            return False  # the rank ended: its last words went, nothing goes after them
        request = self._retry if self._retry is not None else self._request(self._drain())
        return self._send(request, max(1.0, self.interval * 4))

    def _send(self, request: pb.HeartbeatRequest, timeout: float) -> bool:
        """Send one beat and act on the reply; False when it did not go (kept for a retry, or
        dropped when refused for what it carries)."""
        try:
            reply = self._stub.SendHeartbeat(request, timeout=timeout)
        except grpc.RpcError as e:
            code = e.code()
            if _refused(e):
                self._drop(request, e.details() or code.name)
                return False
            self._retry = request  # the same points go again, in order, without rebuilding them
            silent = time.monotonic() - self._last_ok
            if not self._obey:
                pass
            elif code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
                self._on_abort(f"the master refused this worker's heartbeat: {e.details()}")
            elif self._master_gone(e):
                self._on_abort(
                    "the master's port on this host refuses connections: the master is gone, "
                    "so this worker ends instead of training on alone"
                )
            elif silent > self.master_timeout and self.owner_watched:
                if not self._said_busy:
                    self._said_busy = True
                    log.warning(
                        "the master has not answered for %.1fs (%s), but its process lives: it is "
                        "busy, so this rank trains on and keeps its points until it answers",
                        silent,
                        code.name,
                    )
            elif silent > self.master_timeout:
                self._on_abort(
                    f"the master has not answered for {silent:.1f}s ({code.name}): "
                    "it is gone, so this worker ends instead of training on alone"
                )
            else:
                log.debug("heartbeat failed (%s), retrying", code.name)
            return False
        self._retry = None
        self._refused = 0
        if self._said_busy:
            log.warning("the master answers again, after %.1fs", time.monotonic() - self._last_ok)
            self._said_busy = False
        self._last_ok = time.monotonic()
        self.answered = True
        # The master spaces beats out as its callers grow (orch.master.control.pace); never
        # more often than this rank's own interval.
        self.interval = max(self.base_interval, reply.interval) if reply.interval > 0 else self.base_interval
        if request.dropped_points == self.dropped:
            self._untold = False
        if request.note and request.note == self.note:
            self.note = ""  # told
        if reply.send_stack and self.stack_of is not None and self._stack is None:
            self._stack = self.stack_of()  # it goes in the next beat
        self.hold_after = reply.hold_after_step
        if reply.hold_after_step:
            self.last_hold = reply.hold_after_step
        if not self._obey:
            pass
        elif reply.command == pb.STOP:
            self.told_stop = True
            self._on_stop(reply.stop_at_step)
        elif reply.command == pb.ABORT:
            # The steps before the run's last checkpoint, which a restart does not replay, stay
            # in its history: the points logged so far go before this process ends.
            self._obey = False
            self._say_last_words(time.monotonic() + ABORT_FLUSH)
            self._on_abort(f"the master ended this rank: {reply.reason or 'another rank failed'}")
        return True

    def _drop(self, request: pb.HeartbeatRequest, why: str) -> None:
        """The master refused this beat for what it carries: sending it again would be refused
        again, forever. Its points are dropped and counted; the next beat tells why."""
        self._retry = None
        lost = sum(len(s.steps) for s in request.series)
        self.dropped += lost
        self.dropped_reason = f"the master refused a heartbeat of {lost:,} points: {why}"[:MAX_REASON_LEN]
        self._untold = True
        log.warning("dropped %d points: %s", lost, self.dropped_reason)


def _refused(e: grpc.RpcError) -> bool:
    """The master refused the beat for what it carries (a bad field, a cap, a message too big):
    the same beat would be refused again. A full call budget (RESOURCE_EXHAUSTED, "retry
    later") or an unreachable master is worth a retry."""
    code = e.code()
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        return True
    return code is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in (e.details() or "")


def salvage(name: str, steps: list[int], values: list[float], times: list[float]) -> tuple[pb.Series, int]:
    """The good points of a series that held a bad one, and how many were bad (dropped)."""
    kept, bad = pb.Series(name=name), 0
    for step, value, t in zip(steps, values, times, strict=True):
        try:
            point = pb.Series(steps=[step], values=[value], times=[t])
        except (TypeError, ValueError):
            bad += 1
            log.warning("dropped a point of %r at step %r: %r is not a real number", name, step, value)
            continue
        kept.MergeFrom(point)
    return kept, bad
