"""A gang: ranks that stay up across cells, each call a run of its own (``orch.gang``).

``gang = orch.gang(world_size=4)`` starts the ranks once (from the workers' forkserver, as a
launch does); ``gang.run(fn, *args, **kwargs)`` runs ``fn(ctx, *args, **kwargs)`` on every
rank and returns an :class:`~orch.launchers.run.Run`: its own master, run dir, panel, stacks,
Stop and values, as any launch. The ranks keep their process group and their namespace
(``ctx.state``) between calls, so one cell builds the model and the next trains it. A
``%%orch gang`` cell runs its code on every rank in that namespace (:mod:`orch._magic`);
``gang.pull(name, rank=0)`` and ``gang.push(name=value)`` move objects.

A call that fails ends as a failed run, naming the rank, and the gang keeps its ranks and
their state: the ranks still in the call end their part (a collective they wait in is freed,
other code interrupted: :mod:`orch.runtime.gang`), and when a collective was left half done
the ranks make their process group again at the next call, in the same processes, with their
``ctx.state`` and their ``ctx.ddp`` models rewrapped. Only a rank that died, or that did not
end its part within :data:`SETTLE_WAIT` (a native call that never returns), ends the gang's
ranks: the next call starts them afresh (a new process group; ``ctx.state`` is empty again),
and the failed call's error and the next call's first line say what was lost. ``close()``, the
end of a ``with`` block and the kernel's death end every rank.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import multiprocessing as mp
import secrets
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from typing_extensions import Unpack

from orch._viewable import panel_class
from orch.errors import OrchError
from orch.launchers.clusters import Cluster, kind_of
from orch.launchers.front import RunOptions, spec_of
from orch.launchers.launcher import RunParts
from orch.launchers.local.group import _main_not_inherited, worker_context
from orch.launchers.local.launcher import LocalLauncher
from orch.launchers.run import Run, register_exit_hook
from orch.launchers.spec import LaunchSpec
from orch.master.coordinator import Coordinator
from orch.record.store import tail
from orch.record.user_folders import user_folder
from orch.record.writes import own_dir, private_dir
from orch.runtime import gang as rank_side
from orch.runtime._children import kill_tree, tree
from orch.runtime.owner import Owner
from orch.runtime.script import Script
from orch.runtime.source import SourceMap, cell_sources
from orch.wire.states import describe_exit

log = logging.getLogger(__name__)

END_WAIT = 3.0  # seconds a call's ranks get to send their code once its run ended
# Seconds the ranks of a failed call get to end their part (told by the master's ABORT, at
# their next heartbeat) before the gang gives up on them and ends its ranks.
SETTLE_WAIT = 10.0


class Gang:
    """Ranks that stay up across calls. Use :func:`orch.gang` to make one."""

    def __init__(
        self,
        world_size: int = 4,
        *,
        run_root: str = "runs",
        cluster: Cluster | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_ca: str | None = None,
        **options: Unpack[RunOptions],
    ) -> None:
        if "args" in options or "module" in options:
            raise OrchError(
                "a gang runs functions of ctx (gang.run(fn, ...)), not scripts: leave out args= and module="
            )
        self.world_size = world_size
        self.run_root = run_root
        self.options: RunOptions = dict(options)  # type: ignore[assignment]
        self.gang_id = secrets.token_hex(6)
        first = spec_of(
            "orch.gang",
            RunOptions,
            self.options,
            fn=None,
            world_size=world_size,
            run_root=run_root,
            cluster=cluster,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_ca=tls_ca,
        )
        # With a certificate and key every call's master serves TLS, and so does a cluster gang's
        # dial-back (orch.wire.channel): the calls' specs and tokens are secret on the network.
        self.tls = {"tls_cert": tls_cert, "tls_key": tls_key, "tls_ca": tls_ca}
        self.startup_timeout = first.startup_timeout
        # The ranks' file store: runs/.gangs/<id>, or in a shared run root this user's own
        # .orch-<uid>/gangs/<id> (orch.record.user_folders), so no other user's folder blocks it.
        self.folder = user_folder(run_root, "gangs") / self.gang_id
        # A gang on a cluster: its ranks are the tasks of one job of the cluster's kind (self.job).
        self.cluster = cluster
        self.kind = kind_of(cluster) if cluster is not None else None
        if self.kind is not None and (self.kind.gang_job is None or self.kind.place_rank is None):
            raise OrchError(f"the {self.kind.name} cluster kind offers no gangs: use orch.launch on it")
        self.job: Any = None
        # where the calls' masters bind
        self.host = self.kind.master_host(cluster) if self.kind is not None else ""
        self.calls: list[Run] = []
        self.restarts = 0
        self.remakes = 0  # the process group made again in the same ranks after a broken collective
        self.lost = ""  # why the ranks' state was lost, said by the next call
        self._procs: list[mp.process.BaseProcess] = []
        self._conns: list[Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._start()
        _GANGS.add(self)
        register_exit_hook()

    # -- the ranks -------------------------------------------------------------------------
    def _start(self) -> None:
        private_dir(self.folder.parent)  # the run root above it is walked, never made private
        private_dir(self.folder)
        if self.kind is not None:
            assert self.kind.gang_job is not None
            self._procs, self._conns = [], []
            self.job = self.kind.gang_job(self.cluster, self.gang_id, self.restarts, self.tls)
            say = lambda line: print(f"orch: gang {self.gang_id}: {line}", flush=True)  # noqa: E731
            self._conns = self.job.start(self.world_size, self.folder, self.startup_timeout, say)
            return
        ctx = worker_context()
        owner = Owner()
        self._procs, self._conns = [], []
        for i in range(self.world_size):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=rank_side.gang_main, args=(owner, child), name=f"orch-gang-{self.gang_id}-{i}"
            )
            with _main_not_inherited():
                p.start()
            child.close()
            self._procs.append(p)
            self._conns.append(parent)

    def _end_ranks(self, grace: float = 1.0) -> None:
        """End every rank: close their pipes (a rank between calls leaves), then SIGTERM, SIGKILL
        (on a cluster: close their connections, then end the job)."""
        if self.job is not None:
            job, self.job = self.job, None
            job.end()
            self._conns = []
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.close()
        # What the ranks started, read before any is killed: a killed rank's orphans go to init.
        started = {d: t for p in self._procs if p.pid is not None for d, t in tree(p.pid).items()}
        deadline = time.monotonic() + grace
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.exitcode is None:
                with contextlib.suppress(Exception):
                    p.terminate()
        for p in self._procs:
            p.join(grace)
            if p.exitcode is None:
                with contextlib.suppress(Exception):
                    p.kill()
                p.join(5.0)
        kill_tree(started)
        self._procs, self._conns = [], []

    def broken(self, why: str) -> None:
        """A call failed: end the ranks now; the next call starts them afresh, saying ``why``."""
        self.lost = why
        self._end_ranks(0.2)

    @property
    def rendezvous(self) -> str:
        """The file store the ranks' group is made through: a new one for each start of the
        ranks and for each remake of their group (which a rank sees, and makes it again)."""
        name = f"rendezvous-{self.restarts}" + (f".{self.remakes}" if self.remakes else "")
        return str(self.folder.resolve() / name)

    def check_group(self, outcomes: dict[int, dict[str, Any]]) -> bool:
        """Every rank of a call ended its part and stays up: is their group whole? When
        a rank freed a collective, or one failed inside a collective, or their counts of
        collectives differ (one was left half done), the next call makes it again. Returns
        True when it must be made again."""
        counts = {tuple(o.get("sequence", ())) for o in outcomes.values()}
        remake = len(counts) > 1 or any(
            o.get("freed") or o.get("collective_error") for o in outcomes.values()
        )
        if remake:
            self.remakes += 1
        return remake

    @property
    def pids(self) -> list[int]:
        """The ranks' process ids, in rank order (empty while the gang is down, or on a cluster)."""
        return [p.pid or 0 for p in self._procs]

    @property
    def up(self) -> bool:
        return bool(self._conns)

    def exit_code(self, rank: int) -> int | None:
        """A rank's process ended between its calls' words: its exit code (on a cluster, where the
        process is on another machine, -9 once its connection is gone), else None."""
        if self.cluster is not None:
            return -9
        return self._procs[rank].exitcode

    # -- calls -----------------------------------------------------------------------------
    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Run:
        """Run ``fn(ctx, *args, **kwargs)`` on every rank; return the call's run at once
        (``.wait()`` for what the ranks returned, ``.panel()`` to watch it)."""
        if isinstance(fn, (str, Script)) or not callable(fn):
            raise OrchError(f"gang.run takes a function of ctx, got {fn!r:.80}")
        return self._call(rank_side.call(fn, args, kwargs), getattr(fn, "__name__", "call"))

    def _call(
        self, fn: Callable[[Any], Any], label: str, sources: SourceMap | None = None, transfer: bool = False
    ) -> Run:
        with self._lock:
            if self._closed:
                raise OrchError(f"gang {self.gang_id} is closed: make a new one with orch.gang(...)")
            for ended in self.calls:
                if ended.done:  # its master goes (its record stays, which its panel then shows)
                    ended.close()
            live = [c for c in self.calls if not c.done]
            if live:
                raise OrchError(
                    f"gang {self.gang_id} is running call {len(self.calls)} ({live[0].run_id}): wait for "
                    "it (run.wait()), or stop it (run.stop()), before the next call"
                )
            if not self.up:
                self.restarts += 1
                print(
                    f"orch: gang {self.gang_id} started afresh: {self.lost}; its ranks' state is lost",
                    flush=True,
                )
                self._start()
            spec = spec_of(
                "gang.run",
                RunOptions,
                self.options,
                fn=fn,
                world_size=self.world_size,
                run_root=self.run_root,
                cluster=self.cluster,  # checked as a launch's; the gang's own ranks take the call
                **self.tls,
                name=f"gang {self.gang_id} call {len(self.calls) + 1}: {label}",
            )
            run = Run(spec, sources=sources, launcher=lambda s, c, d: GangLauncher(self, s, c, d))
            run.transfer = transfer  # a pull or a push: not a run of the user's (see orch.runs)
            self.calls.append(run)
        return run.start()

    def pull(self, name: str, rank: int = 0) -> Any:
        """The object ``name`` in rank ``rank``'s namespace (``ctx.state.name``), here."""
        with self._call(
            rank_side.call(rank_side.pull, (name, rank), {}), f"pull {name}", transfer=True
        ) as run:
            return run.wait().values[rank]

    def push(self, **values: Any) -> None:
        """Set ``values`` in every rank's namespace (``ctx.state``; a ``%%orch`` cell's names)."""
        with self._call(
            rank_side.call(rank_side.push, (values,), {}), f"push {', '.join(values)}", transfer=True
        ) as run:
            run.wait()

    def run_cell(self, source: str, filename: str, count: int | None = None) -> Run:
        """Run a cell's code on every rank, in their namespaces (the ``%%orch`` magic); ``count``:
        the notebook cell's execution count, which names it (``cell In[3]``) in its run's name,
        its tracebacks and its record."""
        label = f"cell In[{count}]" if count is not None else "cell"
        return self._call(
            rank_side.call(rank_side.run_cell, (source, filename), {}),
            label,
            sources=cell_sources(source, filename, count),
        )

    # -- ending ----------------------------------------------------------------------------
    def close(self) -> None:
        """End the live call (if any) and every rank; the gang takes no more calls."""
        with self._lock:
            self._closed = True
        for call in self.calls:
            call.close()  # a live one ends; an ended one's master goes
        self._end_ranks()
        _GANGS.discard(self)
        with contextlib.suppress(OSError, OrchError), own_dir(self.folder) as folder:
            for name in folder.names():
                folder.remove(name)  # the ranks' file stores, one a start
        with contextlib.suppress(OSError, OrchError), own_dir(self.folder.parent) as gangs:
            gangs.remove_empty(self.folder.name)

    def __enter__(self) -> Gang:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def panel(self, **options: Any) -> Any:
        """The calls so far as one session: each training call's curve goes on from where the
        call before ended, on one step axis, the calls' boundaries marked; a table lists every
        call (those that logged nothing too). Options: ``metric=``, ``x="time"``."""
        return panel_class("gang")(self, **options)

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("up" if self.up else "down")
        return f"<orch.Gang {self.gang_id}: {self.world_size} ranks, {state}, {len(self.calls)} calls>"


class GangLauncher(LocalLauncher):
    """The ranks of one gang call: the gang's processes, sent the call instead of started."""

    def __init__(self, gang: Gang, spec: LaunchSpec, coordinator: Coordinator, run_dir: Path) -> None:
        super().__init__(spec, coordinator, run_dir)
        self.gang = gang
        # On a cluster the ranks are on the nodes: they dial the master's TCP address, not its private socket.
        self.ranks_on_this_machine = gang.cluster is None
        coordinator.rendezvous_file = True  # the gang's own file store, made at its first call
        coordinator.starting(f"the gang's {spec.world_size} ranks take the call")
        self.worker_ids: list[str] = []
        self.returned: dict[int, int] = {}
        self.outcomes: dict[int, dict[str, Any]] = {}  # what each rank said at its call's end
        self.died: dict[int, int] = {}  # the ranks whose process ended: their exit codes

    def master_host(self, spec: LaunchSpec) -> str:
        return self.gang.host or super().master_host(spec)  # on a cluster: where the nodes reach it

    def supervise(self, parts: RunParts) -> None:
        coord, gang = self.coordinator, self.gang
        specs = self.worker_specs(parts, 1)
        self.worker_ids = [s.worker_id for s in specs]
        import cloudpickle

        try:
            for spec, conn in zip(specs, gang._conns, strict=True):
                spec.owner = None  # the rank watches the gang's launcher already
                spec.rendezvous_file = gang.rendezvous  # another one: the ranks make their group again
                if gang.kind is not None:
                    assert gang.kind.place_rank is not None
                    gang.kind.place_rank(spec, gang.cluster, parts.token)
                conn.send_bytes(cloudpickle.dumps(spec))
        except (OSError, ValueError) as e:
            coord.fail(f"the gang's ranks could not take the call: {e}")
            gang.broken(f"call {len(gang.calls)} could not reach its ranks")
            return
        done_since: float | None = None
        while not parts.closing.is_set():
            self.collect_exits()
            if coord.state.failing:
                self._settle(parts)
                return
            if len(self.returned) == len(specs):
                if not coord.state.done:
                    coord.fail("every rank's call returned before the run finished")
                # A stop past its grace frees a rank from its collective too (an ABORT): the
                # group is then made again at the next call, as after a failure.
                if not self.died:
                    gang.check_group(self.outcomes)
                return
            if coord.state.done:
                done_since = done_since if done_since is not None else time.monotonic()
                if time.monotonic() - done_since > END_WAIT:
                    gang.broken(f"call {len(gang.calls)}'s ranks did not return after it ended")
                    self._gone(expected=True)
                    return
            time.sleep(self.spec.poll_interval)

    def _settle(self, parts: RunParts) -> None:
        """The call failed: wait for its ranks to end their part (the master's ABORT tells those
        still in it), then keep the gang, or end its ranks if one died or never ended its part."""
        coord, gang = self.coordinator, self.gang
        wait = max(SETTLE_WAIT, 4 * self.spec.heartbeat_interval)
        deadline = time.monotonic() + wait
        while len(self.returned) < len(self.worker_ids) and not parts.closing.is_set():
            if time.monotonic() > deadline:
                break
            time.sleep(self.spec.poll_interval)
            self.collect_exits()
        call = f"call {len(gang.calls)} ({self.run_dir.name})"
        left = [i for i in range(len(self.worker_ids)) if i not in self.returned]
        if self.died or left:
            what = [f"rank {i}'s process ended ({describe_exit(c)})" for i, c in sorted(self.died.items())]
            what += [
                f"rank {i} did not end its part within {wait:g}s of the failure (in a native call that "
                "never returns?)"
                for i in left
            ]
            lost = "; ".join(what)
            gang.broken(f"{call} failed and {lost}"[:400])
            self._gone(expected=True)
            said = (
                f"{lost}: gang {gang.gang_id} ended its ranks; the next call starts them afresh, "
                "without their ctx.state and process group"
            )
        else:
            remade = gang.check_group(self.outcomes)
            said = f"gang {gang.gang_id} kept its ranks and their ctx.state" + (
                ": a collective was left half done, so the next call makes their process group again "
                "in the same processes (ctx.ddp models rewrapped)"
                if remade
                else ", and their process group: the next call runs in them"
            )
        refusal = coord.restart_refusal()
        coord.give_up("; ".join(x for x in (refusal, said) if x))

    def collect_exits(self) -> None:
        """A rank's call returned (its outcome, on the pipe), or its process died."""
        for i, conn in enumerate(self.gang._conns):
            if i in self.returned or i >= len(self.worker_ids):
                continue
            code: int | None = None
            try:
                if conn.poll():
                    outcome = json.loads(conn.recv_bytes())
                    code = int(outcome["code"])
                    self.outcomes[i] = outcome
            except (EOFError, OSError, ValueError, KeyError, TypeError):
                code = self.gang.exit_code(i)  # its process is gone (or going: looked at again next time)
                if code is not None:
                    self.died[i] = code
            if code is None:
                continue
            self.returned[i] = code
            wid = self.worker_ids[i]
            detail = "" if code == 0 else tail(self.run_dir / "logs" / f"{wid}.log", 30)
            self.coordinator.rank_exited(wid, code, detail=detail)

    def _gone(self, expected: bool) -> None:
        for i, wid in enumerate(self.worker_ids):
            if i not in self.returned:
                self.returned[i] = -15
                self.coordinator.rank_exited(wid, -15, expected=expected)

    def end(self) -> None:
        if len(self.returned) < len(self.worker_ids):
            self.gang.broken(f"call {self.run_dir.name} was closed while it ran")
            self._gone(expected=True)

    def log_files(self) -> dict[str, Path]:
        return {wid: self.run_dir / "logs" / f"{wid}.log" for wid in self.worker_ids}


def gang(
    world_size: int = 4,
    *,
    run_root: str = "runs",
    cluster: Cluster | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_ca: str | None = None,
    **options: Unpack[RunOptions],
) -> Gang:
    """Start ``world_size`` ranks that stay up across calls (see :class:`Gang`): build a model in
    one cell with ``gang.run(fn)`` or ``%%orch gang``, train it in the next, evaluate, change the
    learning rate and train again, without a new process group. Takes every run option of
    ``orch.launch`` (``heartbeat_timeout``, ``hang_timeout``, ``stop_grace``, ...), and
    ``cluster=orch.Slurm(...)``: the ranks are then the tasks of one Slurm job that keeps its
    allocation across cells until ``gang.close()`` (or the kernel's end) cancels it.
    ``tls_cert`` and ``tls_key`` (``tls_ca`` to verify them, default the certificate) serve each
    call's master with TLS, and a Slurm gang's dial-back too: what crosses the cluster's
    network is then secret, not only authenticated."""
    return Gang(
        world_size, run_root=run_root, cluster=cluster, tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca,
        **options,
    )  # fmt: skip


_GANGS: set[Gang] = set()


@atexit.register
def close_all_gangs() -> None:
    """End every gang of this process (at its exit, and ``orch.close_all()``)."""
    for g in list(_GANGS):
        with contextlib.suppress(Exception):
            g.close()
