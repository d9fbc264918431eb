"""The notebook-facing entry points: ``launch`` and ``attach``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, overload

from typing_extensions import Unpack

from orch.errors import ConfigError
from orch.experiments.catalog import live_notice
from orch.launchers.apart.client import ApartRun, in_notebook_kernel, launch_apart, live_apart_runs
from orch.launchers.attached import AttachedRun, open_run
from orch.launchers.detached.run import DetachedRun
from orch.launchers.detached.start import start_detached
from orch.launchers.front import LaunchOptions, options_doc, spec_of
from orch.launchers.run import Run, live_runs
from orch.runtime.nested import refuse_launch
from orch.runtime.target import TrainFn


def _check_ports(master_port: int | None, rdzv_port: int | None) -> None:
    taken_by: list[tuple[Run | ApartRun, dict[str, int | None]]] = [
        (
            run,
            {
                "master_port": run.server.port if run.server else None,
                "rdzv_port": run.coordinator.active_rendezvous_port(),
            },
        )
        for run in live_runs()
    ]
    taken_by += [(run, {"master_port": run.master_port}) for run in live_apart_runs()]
    for run, taken in taken_by:
        for option, port in (("master_port", master_port), ("rdzv_port", rdzv_port)):
            if port and port in taken.values():
                raise ConfigError(
                    f"run {run.run_id} is still running on port {port}: call run.stop() or "
                    f"run.close() on it first, or leave {option} out to pick a free port"
                )


@overload
def launch(
    train: TrainFn | str | None = None,
    world_size: int = 4,
    config: dict[str, Any] | None = None,
    *,
    detach: Literal[False] = False,
    apart: Literal[False],
    **options: Unpack[LaunchOptions],
) -> Run: ...


@overload
def launch(
    train: TrainFn | str | None = None,
    world_size: int = 4,
    config: dict[str, Any] | None = None,
    *,
    detach: Literal[False] = False,
    apart: Literal[True],
    **options: Unpack[LaunchOptions],
) -> ApartRun: ...


@overload
def launch(
    train: TrainFn | str | None = None,
    world_size: int = 4,
    config: dict[str, Any] | None = None,
    *,
    detach: Literal[True],
    apart: bool | None = None,
    **options: Unpack[LaunchOptions],
) -> DetachedRun: ...


@overload
def launch(
    train: TrainFn | str | None = None,
    world_size: int = 4,
    config: dict[str, Any] | None = None,
    *,
    detach: Literal[False] = False,
    apart: None = None,
    **options: Unpack[LaunchOptions],
) -> Run | ApartRun: ...


def launch(
    train: TrainFn | str | None = None,
    world_size: int = 4,
    config: dict[str, Any] | None = None,
    *,
    detach: bool = False,
    apart: bool | None = None,
    **options: Unpack[LaunchOptions],
) -> Run | DetachedRun:
    """Start ``train(ctx)`` on ``world_size`` local worker processes; return the :class:`Run` at once.

    ``train`` is a function (defined in a notebook cell; closures and lambdas work), an
    import path ``"package.module:function"`` (found from the current folder, as
    ``python -m`` finds it), a file path ``"train.py:main"``, or ``None`` for the built-in
    example job. The workers run in the current folder. Code written for torchrun runs
    unchanged: ``train="train.py"`` (a script's path, no ``:function``) with ``args=[...]``,
    or ``module="pkg.train"``, runs it in each rank as ``__main__`` with those arguments, as
    torchrun does; every rank carries torchrun's environment (``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``, ...), so Accelerate, Lightning and the HF Trainer see the run's world.
    ``config`` reaches the function as ``ctx.config``; ``steps`` sets ``config["steps"]``.
    On a failure the whole group is torn down and, up to ``max_restarts`` times, started
    again; ``ctx.load_checkpoint()`` lets it resume after its last ``ctx.save_checkpoint``.
    A rank whose heartbeats stop for ``heartbeat_timeout`` seconds counts as lost. A run whose
    ranks' steps stand still longer than its hang limit (10x the usual time between steps, at
    least 30 s, at most ``hang_timeout``; ``startup_timeout`` before the first step) is "not
    progressing": the panel shows every rank's stack, and ``on_hang="fail"`` fails it. A stop
    the ranks do not reach within ``stop_grace`` seconds ends them (SIGTERM, then SIGKILL).
    The master binds 127.0.0.1 and takes only calls that carry the run's token (``token``,
    else ``$ORCH_TOKEN``, else a random one: ``run.token``);
    ``tls_cert``/``tls_key`` make it serve TLS, verified against ``tls_ca`` (default: the
    certificate itself). ``name`` labels the run in ``orch.runs()``.
    Ports default to 50051 (master) and 29500 (rendezvous) when free, else free ones; a
    port you name must be free. Everything is checked before any process starts: a bad
    argument is an :class:`orch.ConfigError` that says what to pass instead.

    By default the run ends with this process (the kernel): its workers watch it. With
    ``detach=True`` the master and the workers run under a supervisor process of their own
    session, which outlives the kernel; this returns an :class:`orch.DetachedRun` once its
    master serves, and ``orch.attach("runs/<id>")`` reconnects from any later process.
    ``close()`` on it ends the run; ``disconnect()`` only lets go of it.

    With ``cluster=orch.Slurm(nodes, tasks_per_node, ...)`` the ranks run on a Slurm cluster:
    the master stays in this process, bound to the address the nodes reach, and one batch
    job runs a host agent per node (see :mod:`orch.launchers.slurm.job`). The panel shows the job's queue
    state and nodes; a stop, a failure, ``close()`` or this process's death ends the job.
    A failure restarts every node's ranks (``max_restarts``); with ``min_world_size`` the
    restart goes on without nodes that fell silent while that many ranks remain. With
    ``cluster=orch.Ray(address, nodes, ranks_per_node, ...)`` the ranks run on a Ray cluster's
    nodes, one host agent per node in a placement group (see :mod:`orch.launchers.ray.launcher`).
    """
    if apart is None:  # a notebook kernel's cells share its process: its runs' masters live apart
        apart = in_notebook_kernel() and not detach and options.get("cluster") is None
    if apart and (detach or options.get("cluster") is not None):
        raise ConfigError(
            "apart=True puts a local run's master in a process this one owns: "
            + (
                "a detached run's master already lives apart; leave out apart"
                if detach
                else "a cluster run's master lives in this process; leave out apart"
            )
        )
    if detach and options.get("cluster") is not None:
        kind = type(options.get("cluster")).__name__
        raise ConfigError(
            f"detach=True with a cluster: a {kind} run's master lives in this process; "
            "leave out detach (the job is cancelled when this process ends)"
        )
    refuse_launch("orch.launch")
    spec = spec_of(
        "orch.launch",
        LaunchOptions,
        options,
        fn=train,
        world_size=world_size,
        config={} if config is None else config,
    )
    _check_ports(spec.master_port, spec.rdzv_port)
    notice = live_notice()  # a launch cell run twice: the first run is still training
    if notice:
        print(notice, flush=True)
    if detach:
        return start_detached(spec)
    if apart:
        return launch_apart(spec)
    return Run(spec).start()


launch.__doc__ = (launch.__doc__ or "").rstrip() + options_doc(LaunchOptions)


def attach(
    target: str | Path,
    *,
    token: str | None = None,
    tls_ca: str | Path | None = None,
    timeout: float = 10.0,
    run_root: str | Path = "runs",
) -> AttachedRun | DetachedRun | Run:
    """Watch a run started elsewhere, by its run dir, its run id or its master's address.

    ``attach("runs/<id>")`` or ``attach("<id>")`` (under ``run_root``) reconnects to a run of
    this machine still going (detached, or launched by another process of yours: a notebook,
    ``orch run``), reading its master's address and token from ``runs/<id>/attach.json``
    (refused unless only you can read it); a run that ended shows its final state, read from
    the run dir. It returns an :class:`orch.launchers.detached.start.DetachedRun`,
    or, for a run this process launched and still runs, that :class:`orch.Run` itself (so
    ``orch.attach("<id>").stop()`` reaches a run that ``run`` no longer names).
    ``attach("HOST:PORT", token=...)`` watches any master (``orch master``) and returns an
    :class:`AttachedRun`; ``token`` defaults to ``$ORCH_TOKEN``, ``tls_ca`` verifies a
    master serving TLS.
    """
    run: AttachedRun | DetachedRun | Run = open_run(
        target, run_root, token=token, tls_ca=tls_ca, timeout=timeout, follow=True
    )
    return run
