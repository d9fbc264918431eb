"""A rank of a gang: a process that stays up across calls (``orch.gang``), each call a run.

The launcher starts the gang's ranks once, from the workers' forkserver, each with a pipe.
For each call it sends every rank the call's :class:`~orch.runtime.spec.WorkerSpec`; the rank
joins that call's master as any worker joins a run (register, the start barrier, heartbeats,
Stop, stacks, its end reported), runs the function, and sends back its exit code instead of
exiting. Its process group is made at the first call, through a file store in the gang's own
folder, and kept; so is its namespace, ``ctx.state``, where a ``%%orch`` cell's names live.

A call that fails leaves the rank up, with its namespace and its group. The master tells the
ranks still in the call to end their part (ABORT): such a rank frees the collective it may wait
in by shutting down its group's connections, and interrupts its code if it waits elsewhere
(:func:`orch.runtime.worker._abort_call`). Each rank sends back its exit code and what says
whether its group is whole (:meth:`~orch.runtime.gang_session.Session.outcome`); where one is
not, the launcher gives the next call a new rendezvous and the ranks make their group again
in the same processes, rewrapping their ``ctx.ddp`` models (:mod:`orch.runtime._mend`). A
rank ends when the process that started the gang is gone, or when the launcher closes its pipe
(it does when a rank died, or did not end its part of a failed call: the gang then starts afresh).

On a cluster the ranks are the tasks of the gang's job (Slurm's tasks, a Ray actor's
processes: :mod:`orch.launchers.cluster_gang`): each dials the kernel back
(:func:`connect_main`) and takes its calls on that connection.
"""

from __future__ import annotations

import json
import linecache
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from orch.errors import CallAborted
from orch.runtime._children import become_subreaper, end_descendants, end_with_sigterm
from orch.runtime.gang_session import Session
from orch.runtime.launcher_env import GANG_RANK_ENV
from orch.runtime.owner import Owner, exit_when_gone
from orch.runtime.worker import EXIT_FAILED, enter, run_worker
from orch.wire.auth import TOKEN_ENV
from orch.wire.channel import dial
from orch.wire.net import split_address
from orch.wire.states import CALL_ENDED, EXIT_ABORTED


def gang_main(owner: Owner | None, conn: Connection) -> None:
    """A gang rank's process: take calls from ``conn`` until it closes, or a call failed."""
    import cloudpickle

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Interrupt reaches a call through its master
    if owner is not None:
        exit_when_gone(owner, EXIT_ABORTED)
    become_subreaper()
    end_with_sigterm()
    session = Session(watched=owner is not None)

    def aborted(_signum: int, _frame: Any) -> None:
        # Sent by the heartbeat thread after a peer's failure (worker._abort_call), while the
        # user's code still ran: it ends its part of the call here.
        if session.in_user_code and session.freed:
            session.in_user_code = False
            raise CallAborted(f"{CALL_ENDED}: another rank's failed")

    signal.signal(signal.SIGUSR2, aborted)
    code = 0
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            break  # the gang was closed
        spec = cloudpickle.loads(payload)
        enter(spec)
        session.new_call()
        try:
            code = run_worker(spec, session)
        except Exception:  # orch's own failure (the master unreachable): this call's, not the gang's
            traceback.print_exc()
            code = EXIT_FAILED
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            conn.send_bytes(json.dumps(session.outcome(code)).encode())
        except OSError:
            break
    end_descendants()
    os._exit(code)


# -- what a gang call runs: the user's function, a cell's code, a pull, a push ----------------
def call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[Any], Any]:
    """``fn(ctx, *args, **kwargs)`` as a training function of ``ctx``."""

    def called(ctx: Any) -> Any:
        return fn(ctx, *args, **kwargs)

    called.__name__ = getattr(fn, "__name__", "call")
    called.__qualname__ = getattr(fn, "__qualname__", called.__name__)
    called.__module__ = getattr(fn, "__module__", __name__)
    called.__wrapped__ = fn  # type: ignore[attr-defined]  # where its code came from, for tracebacks
    return called


def run_cell(ctx: Any, source: str, filename: str) -> Any:
    """Run a ``%%orch`` cell's code in the rank's namespace (``ctx.state``, with ``ctx`` in it);
    the value of a last line that is an expression is the call's value, as in a cell."""
    import ast

    namespace = ctx.state.__dict__
    namespace["ctx"] = ctx
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source, filename)
    last = tree.body[-1] if tree.body else None
    if isinstance(last, ast.Expr):
        tree.body.pop()
    exec(compile(tree, filename, "exec"), namespace)  # the user's own cell, on their own ranks
    if not isinstance(last, ast.Expr):
        return None
    return eval(compile(ast.Expression(last.value), filename, "eval"), namespace)


def pull(ctx: Any, name: str, rank: int) -> Any:
    """``name`` from the namespace of rank ``rank`` (the others return nothing)."""
    if ctx.rank != rank:
        return None
    namespace = ctx.state.__dict__
    if name not in namespace:
        shown = ", ".join(sorted(n for n in namespace if not n.startswith("_"))) or "nothing yet"
        raise NameError(f"name {name!r} is not defined on rank {rank} (its names: {shown})")
    return namespace[name]


def push(ctx: Any, values: dict[str, Any]) -> None:
    """Set ``values`` in every rank's namespace."""
    ctx.state.__dict__.update(values)


def connect_main(address: str, tls_ca: str | None = None, tls_name: str | None = None) -> None:
    """A gang rank started by the gang's cluster job (``python -m orch.runtime.gang --connect
    HOST:PORT [--tls-ca CA --tls-name NAME]``): dial the kernel back (over TLS, verifying it
    against ``tls_ca``, when given), pass its challenge with the gang's token (from the job's
    environment, then dropped from it), say this process's rank (``ORCH_GANG_RANK``, else
    Slurm's ``SLURM_PROCID``), then take calls. A connection the kernel closed during its
    handshake (refused in a flood of strangers' connections) is dialled again, for a minute at
    most."""
    token = os.environ.pop(TOKEN_ENV, "")
    if not token:
        sys.exit(
            f"orch gang rank: no {TOKEN_ENV} in the environment: start gangs with orch.gang(cluster=...)"
        )
    host, port = split_address(address)
    rank = int(os.environ.get(GANG_RANK_ENV) or os.environ.get("SLURM_PROCID", "0"))
    deadline = time.monotonic() + 60.0
    while True:
        try:
            conn = dial(host, port, token.encode(), rank, tls_ca=tls_ca, server_name=tls_name)
            break
        except (OSError, EOFError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    gang_main(None, conn)


def _main(argv: list[str]) -> None:
    usage = (
        "usage: python -m orch.runtime.gang --connect HOST:PORT [--tls-ca CA --tls-name NAME] "
        "(a cluster gang's job starts it)"
    )
    if argv[:1] != ["--connect"] or len(argv) not in (2, 6):
        sys.exit(usage)
    options = dict(zip(argv[2::2], argv[3::2], strict=True))
    if set(options) - {"--tls-ca", "--tls-name"}:
        sys.exit(usage)
    connect_main(argv[1], options.get("--tls-ca"), options.get("--tls-name"))


if __name__ == "__main__":
    _main(sys.argv[1:])
