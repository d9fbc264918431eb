"""The ``orch`` command: ``run``, ``sweep``, ``master``, ``worker`` and ``status``; ``runs``,
``show`` and ``logs`` read the run dirs (see :mod:`orch.experiments.catalog`).

Exit codes: 0 the run succeeded, 1 it failed, 2 bad usage, 3 it was stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any

from orch import _runs_cli, _sweep_cli, _worker_cli
from orch._cli_common import Parser, positive, run_command, seconds, token_of, token_options
from orch._text import printable
from orch.errors import ConfigError, PortInUseError, RunFailed
from orch.experiments.run_row import read_row
from orch.launchers.attached import open_run
from orch.launchers.clusters import ClusterFlags, flags_given, kinds
from orch.launchers.contract import exit_code
from orch.launchers.detached.start import start_detached
from orch.launchers.front import add_flag, as_flag, from_flags
from orch.launchers.loaded import LoadedRun
from orch.launchers.run import Run, run_meta, serve
from orch.launchers.spec import LaunchSpec
from orch.record.rundir import write_result
from orch.record.store import RunStore
from orch.runtime.nested import refuse_launch
from orch.views.dashboard import Dashboard, show
from orch.views.output import OutputFollower, parse_ranks
from orch.views.rendering import summary
from orch.wire.auth import certificate_name, new_token, token_from_env
from orch.wire.client import MasterClient, StateMirror
from orch.wire.net import split_address
from orch.wire.states import RunState


def _seconds_or_zero(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or a positive number of seconds, got {text}")
    return value


def _interrupt_to_stop(stop: Any) -> None:
    """First Ctrl-C asks for a graceful stop; a second one exits at once."""
    pressed = {"n": 0}

    def handler(signum: int, frame: Any) -> None:
        pressed["n"] += 1
        if pressed["n"] > 1:
            raise KeyboardInterrupt
        sys.stderr.write("\nstopping gracefully (Ctrl-C again to abort)...\n")
        stop("interrupted from the terminal")

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


# The flags every cluster kind reads (clusters.ClusterFlags): defined once, here.
SHARED_CLUSTER_FLAGS = ("--nodes", "--master-addr")


def _cluster_flags() -> list[ClusterFlags]:
    """The flags of the cluster kinds that have some on ``orch run`` (``--slurm``, ``--ray ADDRESS``)."""
    return [k.cli for k in kinds() if k.cli is not None]


def _selectors() -> str:
    names = [cli.selector for cli in _cluster_flags()]
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """The flags shared by the cluster kinds, then each kind's own group."""
    shared = parser.add_argument_group("on a cluster (with " + _selectors() + ")")
    chosen = ", ".join(cli.selector for cli in _cluster_flags())
    shared.add_argument(
        "--nodes", type=positive, default=None, help=f"nodes of the cluster chosen ({chosen}), default 1"
    )
    shared.add_argument(
        "--master-addr",
        default=None,
        metavar="HOST",
        help="the address of this machine the cluster's nodes reach, where the master listens "
        "(default: this machine's address on the route to the cluster)",
    )
    for cli in _cluster_flags():
        cli.add(parser)


def cluster_from_flags(args: argparse.Namespace) -> Any:
    """The cluster ``orch run --slurm ...`` or ``--ray ADDRESS ...`` asks for (None without a
    kind's selector), each kind building its own from the flags."""
    flagged = _cluster_flags()
    chosen = [cli for cli in flagged if flags_given(args, [cli.selector])]
    if len(chosen) > 1:
        raise ConfigError(f"{' and '.join(c.selector for c in chosen)}: a run goes to one cluster, pass one")
    if not chosen:
        shared = flags_given(args, SHARED_CLUSTER_FLAGS)
        if shared:
            raise ConfigError(f"{', '.join(shared)} only apply to a run on a cluster: add {_selectors()}")
    built = {cli.selector: cli.build(args) for cli in flagged}  # each refuses its flags without its selector
    if not chosen:
        return None
    cli = chosen[0]
    cluster = built[cli.selector]
    if cluster is None:  # its build broke the contract
        raise ConfigError(f"{cli.selector} was given but its cluster kind built no cluster from the flags")
    label = type(cluster).__name__
    if args.detach:
        raise ConfigError(
            f"--detach with {cli.selector}: a {label} run's master lives in this command; leave out --detach"
        )
    if args.world_size is not None and args.world_size != cluster.world_size:
        raise ConfigError(
            f"--workers {args.world_size} but {cli.sizes} is {cluster.world_size}: "
            f"leave out --workers with {cli.selector}"
        )
    return cluster


def cmd_run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except PortInUseError as e:  # named as this command's flag (--master-port), not launch()'s
        raise as_flag(e) from e


def _script(args: argparse.Namespace) -> dict[str, Any]:
    """What ``orch run [flags] train.py ARGS`` or ``orch run [flags] -m pkg.train ARGS`` runs."""
    if args.script is None:
        if args.as_module:
            raise ConfigError("-m names a module to run: orch run [flags] -m pkg.train [its arguments]")
        return {"fn": args.fn}
    if args.fn is not None:
        raise ConfigError(f"--fn {args.fn} and a script ({args.script}): pass one of them")
    if args.as_module:
        return {"fn": None, "module": args.script, "args": args.script_args}
    if not args.script.endswith(".py"):
        raise ConfigError(
            f"{args.script!r} is not a script (train.py) to run: pass a .py file, -m package.module, "
            "or --fn package.module:function for a function of ctx"
        )
    return {"fn": args.script, "args": args.script_args}


def _run(args: argparse.Namespace) -> int:
    refuse_launch("orch run")
    cluster = cluster_from_flags(args)
    flags = from_flags(args)
    flags["world_size"] = cluster.world_size if cluster is not None else (args.world_size or 4)
    spec = LaunchSpec(**{**flags, **_script(args)}, cluster=cluster)
    if args.detach:
        detached = start_detached(spec)
        print(
            f"orch: run {detached.run_id} goes on detached (supervisor pid {detached.supervisor_pid}): "
            f"watch it with `orch.attach({detached.run_id!r})` from Python, or `orch status "
            f"{detached.run_id}`; its logs are in {detached.run_dir}/logs",
            flush=True,
        )
        detached.disconnect()
        return 0
    with Run(spec) as run:
        run.start()
        rdzv = run.coordinator.rendezvous_port or (
            "a file in the run dir"
            if run.coordinator.rendezvous_file
            else "chosen by rank 0 (29500 when free)"
        )
        if run.job is not None:
            where = f"{type(cluster).__name__} job {run.job.job_id} ({cluster.describe()}), " + (
                f"its output in {run.job.output}"
                if hasattr(run.job, "output")
                else f"logs in {run.run_dir}/logs"
            )
        else:
            where = f"logs in {run.run_dir}/logs"
        print(f"orch: run {run.run_id}: master on {run.address}, rendezvous {rdzv}, {where}", flush=True)
        _interrupt_to_stop(run.stop)
        client = run.connect()
        assert client is not None
        with client:
            dash = Dashboard(client, interval=args.refresh)
            follower = OutputFollower(
                run.run_dir / "logs", lambda: [(r.rank, r.worker_id) for r in dash.mirror.ranks], args.output
            )
            dash.output = follower.lines
            mirror = dash.run()
            dash.out.write("".join(line + "\n" for line in follower.lines()))  # what came last
        with contextlib.suppress(RunFailed):  # the summary below names the root cause
            run.wait(timeout=60)
        mirror = run.state()
    print(summary(mirror), flush=True)
    return exit_code(mirror.state)


def cmd_master(args: argparse.Namespace) -> int:
    _min_world_size(args.min_world_size, args.world_size, args.max_restarts)  # in the flags' words
    spec = LaunchSpec(**from_flags(args), remote=True)
    config = spec.config
    coord = spec.coordinator(restart_through_hosts=True)
    coord.rendezvous_port = spec.rdzv_port or 0
    run_dir = Path(args.run_root) / coord.run_id
    token = token_from_env(token_of(args))
    shown = ""
    if token is None:
        token, shown = new_token(), "ORCH_TOKEN=<token> "
    store = RunStore(run_dir)
    try:
        server, _ = serve(
            coord,
            store,
            run_meta(coord, config=config, max_restarts=args.max_restarts),
            host=args.master_host,
            port=args.master_port,
            token=token,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
        )
    except BaseException as e:  # the record says the master never served, and why, as a launch's does
        coord.fail(f"the master could not start: {e}")
        write_result(coord, run_dir)
        store.close()
        raise
    tls_name = certificate_name(args.tls_cert) if args.tls_cert else None
    print(
        f"orch master: run {coord.run_id} serving on {server.address}; waiting for "
        f"{args.world_size} workers ({shown}orch worker --master {server.address})",
        flush=True,
    )
    if shown:
        print(f"orch master: token {token} (give it to workers as ORCH_TOKEN or --token)", flush=True)
    _interrupt_to_stop(coord.request_stop)
    try:
        if args.no_dashboard:
            while not coord.state.done:
                coord.wait_changed(0.5)
        else:
            with MasterClient(
                server.address, token=token, tls_ca=args.tls_cert, tls_server_name=tls_name
            ) as client:
                Dashboard(client, interval=args.refresh).run()
        # Stay up a little so late pollers and finishing workers still get answers.
        time.sleep(args.linger)
    finally:
        coord.close_run("the master was interrupted before the run ended")
        path = write_result(coord, run_dir)
        server.stop(grace=1.0)
        store.close()
    print(summary(StateMirror.of(coord)), flush=True)
    print(f"orch master: result in {path}", flush=True)
    return exit_code(coord.state)


def _min_world_size(value: int | None, world_size: int, max_restarts: int) -> int | None:
    if value is None:
        return None
    if value > world_size:
        raise ConfigError(f"--min-world-size {value} is above --world-size {world_size}")
    if max_restarts < 1:
        raise ConfigError("--min-world-size applies to restarts: add --max-restarts N")
    return value


def cmd_status(args: argparse.Namespace) -> int:
    """A run's state once: by its run id (or run dir) on this machine, or its master's HOST:PORT."""
    if (args.run is None) == (args.master is None):
        raise ConfigError(
            "orch status takes a run: its id (`orch status RUN_ID`, found under --run-root) or its "
            "master's address (`orch status --master HOST:PORT` with --token)"
        )
    if args.master is not None:
        split_address(args.master)
        with MasterClient(
            args.master, timeout=args.timeout, token=token_of(args), tls_ca=args.tls_ca
        ) as client:
            mirror = StateMirror().poll(client)
        address = args.master
    else:
        if args.token or args.token_file or args.tls_ca:
            raise ConfigError(
                f"{args.run} is a run on this machine: its address and token are read from its run dir; "
                "--token, --token-file and --tls-ca are for --master HOST:PORT"
            )
        with open_run(args.run, args.run_root, timeout=args.timeout, follow=True) as run:
            mirror = run.state()
            address = getattr(run, "address", "") or ""
    if args.json:
        print(json.dumps(mirror.as_dict(), indent=2))
    else:
        show(mirror, address=address)
    return 0


def cmd_stacks(args: argparse.Namespace) -> int:
    """Every running rank's stack, asked for now, grouped by frame."""
    token = token_of(args)
    run = open_run(args.run, args.run_root, token=token, tls_ca=args.tls_ca, timeout=args.timeout)
    with run:
        if isinstance(run, LoadedRun):
            row = read_row(run.run_dir)
            if row.state == RunState.RUNNING.value:
                raise ConfigError(
                    f"run {run.run_id} is going, but its master's token is only in the process that "
                    f"launched it ({row.note}): call run.stacks() there, or pass the master's "
                    f"HOST:PORT ({row.master or 'see run.json'}) with --token"
                )
        print(printable(str(run.stacks(timeout=args.wait))), flush=True)
    return 0


COMMON_FLAGS = (
    "fn",
    "steps",
    "config",
    "rdzv_port",
    "heartbeat_timeout",
    "hang_timeout",
    "on_hang",
    "startup_timeout",
    "stop_grace",
    "seed",
)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="orch", description="Run and watch PyTorch DDP training.")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        for name in COMMON_FLAGS:
            add_flag(sp, name)
        sp.add_argument("--refresh", type=seconds, default=0.5, help="dashboard refresh interval (s)")

    # No abbreviations: what follows the script is its own, and one of its flags must never be
    # taken for a prefix of one of orch's (argparse reads every --flag before it places them).
    r = sub.add_parser(
        "run",
        help="start a master and N local workers, with a live dashboard",
        usage="orch run [flags] [train.py | -m package.module] [the script's arguments]",
        allow_abbrev=False,
    )
    add_flag(r, "world_size", "-n", default=None, help="number of worker processes (default 4)")
    add_flag(r, "master_port")
    add_flag(r, "run_root")
    add_flag(r, "max_restarts")
    r.add_argument(
        "--output",
        type=parse_ranks,
        default=frozenset({0}),
        metavar="RANKS",
        help="whose output to show as it comes: 0 (rank 0, the default), all, none, or ranks such as "
        "0,3 (each rank's whole output is in its log in the run dir)",
    )
    r.add_argument(
        "--detach",
        action="store_true",
        help="start the run under a supervisor of its own and return: it outlives this command "
        "(attach with orch.attach(RUN_ID))",
    )
    add_cluster_flags(r)
    common(r)
    r.add_argument(
        "-m",
        "--module",
        dest="as_module",
        action="store_true",
        help="SCRIPT is a module, run as `python -m` runs it (as torchrun -m)",
    )
    r.add_argument(
        "script",
        nargs="?",
        default=None,
        metavar="SCRIPT",
        help="a script written for torchrun: each rank runs it as __main__, with torchrun's "
        "environment (RANK, LOCAL_RANK, WORLD_SIZE, ...) and the arguments after it",
    )
    r.add_argument("script_args", nargs=argparse.REMAINDER, metavar="...", help="the script's arguments")
    r.set_defaults(func=cmd_run)

    _sweep_cli.add_parser(sub, seconds=seconds)

    m = sub.add_parser("master", help="serve a run for workers started elsewhere")
    add_flag(m, "world_size", "--workers", flag="--world-size", default=None, required=True)
    add_flag(m, "master_host")
    token_options(m, "default $ORCH_TOKEN, else a new one")
    add_flag(m, "tls_cert")
    add_flag(m, "tls_key")
    add_flag(m, "master_port", flag="--port")
    m.add_argument("--no-dashboard", action="store_true", help="print nothing while the run goes")
    add_flag(m, "run_root")
    m.add_argument(
        "--linger", type=_seconds_or_zero, default=3.0, help="seconds to keep serving after the end"
    )
    add_flag(
        m,
        "max_restarts",
        help="on a failure, restart every host's ranks from the last checkpoint up to N times (the "
        "host agents of `orch worker --nproc-per-node K` start them again)",
    )
    add_flag(m, "min_world_size")
    common(m)
    m.set_defaults(func=cmd_master)

    _worker_cli.add_parser(sub)

    s = sub.add_parser("status", help="print a run's state once: by its id, or its master's address")
    s.add_argument(
        "run", metavar="RUN", nargs="?", default=None, help="a run id under --run-root, or a run dir"
    )
    s.add_argument("--run-root", default="runs", help="where the run directories are (default runs)")
    s.add_argument("--master", default=None, help="HOST:PORT of a master elsewhere (with --token)")
    token_options(s, "default $ORCH_TOKEN")
    s.add_argument("--tls-ca", default=None, help="verify the master's TLS certificate with this CA")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--timeout", type=seconds, default=5.0, help="seconds to wait for the master")
    s.set_defaults(func=cmd_status)

    st = sub.add_parser("stacks", help="where every rank of a running run is now: its stack, grouped")
    st.add_argument(
        "run", metavar="RUN", help="a run dir, a run id under --run-root, or a master's HOST:PORT"
    )
    st.add_argument("--run-root", default="runs", help="where the run directories are (default runs)")
    token_options(st, "with HOST:PORT: default $ORCH_TOKEN")
    st.add_argument("--tls-ca", default=None, help="verify the master's TLS certificate with this CA")
    st.add_argument("--wait", type=seconds, default=3.0, help="seconds to wait for the ranks' answers")
    st.add_argument("--timeout", type=seconds, default=10.0, help="seconds to wait for the master")
    st.set_defaults(func=cmd_stacks)

    _runs_cli.add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
