"""The ``orch`` command: ``run``, ``sweep``, ``master``, ``worker`` and ``status``; ``runs``,
``show`` and ``logs`` read the run dirs (see :mod:`orch.experiments.catalog`).

Exit codes: 0 the run succeeded, 1 it failed, 2 bad usage, 3 it was stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from orch import _sweep_cli
from orch._text import printable
from orch.errors import ConfigError, MasterUnavailable, OrchError, RunFailed
from orch.experiments import catalog
from orch.launchers.contract import exit_code
from orch.launchers.detach import start_detached
from orch.launchers.run import Run, run_meta, serve
from orch.launchers.slurm import Slurm, read_function
from orch.launchers.spec import LaunchSpec, add_flag
from orch.master.coordinator import Coordinator
from orch.record.rundir import write_result
from orch.record.store import RunStore
from orch.runtime._launcher_env import LAUNCHER_CHOICES, launched_as
from orch.runtime._target import EXAMPLE, resolve_fn, split_target
from orch.runtime.host import run_local_group
from orch.runtime.spec import WorkerSpec
from orch.runtime.worker import run_worker
from orch.views.dashboard import Dashboard, show, summary
from orch.wire._net import split_address
from orch.wire.auth import certificate_name, new_token, token_from_env
from orch.wire.client import MasterClient, StateMirror


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _rank(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _seconds_or_zero(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or a positive number of seconds, got {text}")
    return value


def _target(text: str) -> str:
    """--fn's form is checked here; whether it exists, where it runs (launcher or worker)."""
    try:
        split_target(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    return text


def _token(args: argparse.Namespace) -> str | None:
    """``--token``, else the first line of ``--token-file`` (kept out of ``ps``), else None."""
    if args.token_file is None:
        token: str | None = args.token
        return token
    try:
        text = Path(args.token_file).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--token-file: cannot read {args.token_file}: {e}") from e
    token = text.rstrip("\r\n")
    if not token:
        raise ConfigError(f"--token-file: {args.token_file} is empty: write the run's token into it")
    if "\n" in token:
        raise ConfigError(f"--token-file: {args.token_file} holds more than one line: write only the token")
    return token


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


def _cluster(args: argparse.Namespace) -> Any:
    """The Slurm cluster ``orch run --slurm`` asks for (None without --slurm)."""
    slurm_only = {"nodes": args.nodes, "tasks_per_node": args.tasks_per_node, "partition": args.partition,
                  "time": args.time, "gpus_per_node": args.gpus_per_node}  # fmt: skip
    if not args.slurm:
        given = [f"--{k.replace('_', '-')}" for k, v in slurm_only.items() if v is not None] + (
            ["--sbatch-arg"] if args.sbatch_arg else []
        )
        if given:
            raise ConfigError(f"{', '.join(given)} only apply to a Slurm run: add --slurm")
        return None
    if args.detach:
        raise ConfigError(
            "--detach with --slurm: a Slurm run's master lives in this command; leave out --detach"
        )

    cluster = Slurm(
        nodes=args.nodes or 1,
        tasks_per_node=args.tasks_per_node or 1,
        partition=args.partition,
        time=args.time or "1:00:00",
        gpus_per_node=args.gpus_per_node,
        sbatch_args=tuple(args.sbatch_arg),
    )
    if args.world_size is not None and args.world_size != cluster.world_size:
        raise ConfigError(
            f"--workers {args.world_size} but --nodes x --tasks-per-node is {cluster.world_size}: "
            "leave out --workers with --slurm"
        )
    return cluster


def cmd_run(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    spec = LaunchSpec(
        fn=args.fn,
        world_size=cluster.world_size if cluster is not None else (args.world_size or 4),
        cluster=cluster,
        config=args.config,
        steps=args.steps,
        master_port=args.master_port,
        rdzv_port=args.rdzv_port,
        run_root=args.run_root,
        heartbeat_timeout=args.heartbeat_timeout,
        max_restarts=args.max_restarts,
    )
    if args.detach:
        detached = start_detached(spec)
        print(
            f"orch: run {detached.run_id} goes on detached (supervisor pid {detached.supervisor_pid}): "
            f"watch it with `orch.attach({detached.run_id!r})` from Python, or `orch status --master "
            f"{detached.address}` with the token in {detached.run_dir}/attach.json; its logs are in "
            f"{detached.run_dir}/logs",
            flush=True,
        )
        detached.disconnect()
        return 0
    with Run(spec) as run:
        run.start()
        rdzv = run.coordinator.rendezvous_port or "chosen by rank 0 (29500 when free)"
        if run.job is not None:
            where = f"Slurm job {run.job.job_id} ({cluster.describe()}), its output in {run.job.output}"
        else:
            where = f"logs in {run.run_dir}/logs"
        print(f"orch: run {run.run_id}: master on {run.address}, rendezvous port {rdzv}, {where}", flush=True)
        _interrupt_to_stop(run.stop)
        client = run.connect()
        assert client is not None
        with client:
            dash = Dashboard(client, interval=args.refresh)
            mirror = dash.run()
        with contextlib.suppress(RunFailed):  # the summary below names the root cause
            run.wait(timeout=60)
        mirror = run.state()
    print(summary(mirror), flush=True)
    return exit_code(mirror.state)


def cmd_master(args: argparse.Namespace) -> int:
    config = dict(args.config)
    if args.steps is not None:
        config["steps"] = args.steps
    coord = Coordinator(
        args.world_size,
        fn=args.fn or EXAMPLE,
        config_json=json.dumps(config),
        total_steps=int(config.get("steps", 0) or 0),
        rendezvous_port=args.rdzv_port or 0,
        heartbeat_timeout=args.heartbeat_timeout,
        max_attempts=args.max_restarts + 1,
        restart_through_hosts=True,
        min_world_size=_min_world_size(args.min_world_size, args.world_size, args.max_restarts),
    )
    run_dir = Path(args.run_root) / coord.run_id
    token = token_from_env(_token(args))
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


def cmd_worker(args: argparse.Namespace) -> int:
    master = args.master or os.environ.get("ORCH_MASTER", "")
    if not master:
        raise ConfigError("pass --master HOST:PORT (the address orch master printed), or set ORCH_MASTER")
    launched = launched_as(os.environ, args.launcher)
    if launched is not None and args.nproc_per_node is not None:
        raise ConfigError(
            f"--nproc-per-node {args.nproc_per_node} under a launcher ({launched.describe()}): the "
            "launcher starts one orch worker per rank, so drop --nproc-per-node and have it start "
            "that many tasks (torchrun --nproc-per-node, srun --ntasks-per-node), or pass "
            "--launcher none to start the ranks here and let the master number them"
        )
    if args.fn is not None:
        resolve_fn(args.fn)  # a typo is an error here, before any process starts
    fn: Any = args.fn
    sources = None
    if args.fn_file is not None:
        if args.fn is not None:
            raise ConfigError("pass --fn or --fn-file, not both")

        # Checked against the run's token before anything in it is unpickled.
        fn, sources = read_function(args.fn_file, token_from_env(_token(args)))

    nproc = args.nproc_per_node or 1
    specs = [
        WorkerSpec(
            run_root=args.run_root,
            master=master,
            fn=fn,
            advertise_addr=args.advertise_addr,
            register_timeout=args.timeout,
            threads=args.threads,
            local_rank=launched.local_rank if launched else i,
            local_world_size=launched.local_world_size if launched else nproc,
            token=_token(args),
            tls_ca=args.tls_ca,
            trust_master=args.trust_master,
            launched=launched,
            log_dir=args.log_dir,
            **({"sources": sources} if sources is not None else {}),
        )
        for i in range(nproc)
    ]
    if args.nproc_per_node is None:
        return run_worker(specs[0])
    # A host agent, even for one rank: it reports a rank's death and restarts it (--max-restarts).
    return run_local_group(specs)


def cmd_status(args: argparse.Namespace) -> int:
    split_address(args.master)
    with MasterClient(args.master, timeout=args.timeout, token=_token(args), tls_ca=args.tls_ca) as client:
        mirror = StateMirror().poll(client)
    if args.json:
        print(json.dumps(mirror.as_dict(), indent=2))
    else:
        show(mirror, address=args.master)
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    table = catalog.runs(args.run_root).filter(state=args.state, sweep=args.sweep)
    if args.json:
        print(json.dumps(table.as_dicts(), indent=2))
    else:
        print(repr(table))  # every cell went through printable
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    print(catalog.describe(catalog.read_row(catalog.find_run(args.run, args.run_root))))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    run_dir = catalog.find_run(args.run, args.run_root)
    if args.follow:
        return _follow_log(run_dir, args.rank)
    path = catalog.rank_log(run_dir, args.rank)
    if path is None or not path.is_file():
        logs = sorted(p.name for p in (run_dir / "logs").glob("*.log"))
        why = f"rank {args.rank} has not registered" if path is None else f"{path} does not exist"
        raise OrchError(
            f"no log for rank {args.rank} of run {run_dir.name}: {why}; "
            + (f"{run_dir}/logs holds {', '.join(logs)}" if logs else f"{run_dir}/logs is empty")
        )
    with open(path, "rb") as f:
        for line in f:
            sys.stdout.write(printable(line.decode("utf-8", "replace")))
    sys.stdout.flush()
    return 0


def _follow_log(run_dir: Path, rank: int, interval: float = 0.25) -> int:
    """Print the rank's log as it grows, until the run ended (or crashed) or Ctrl-C.

    A restart gives the rank a new worker and log: the newest registration is followed.
    Lines are printed whole, so that no escape sequence is split between two reads.
    """
    current: Path | None = None
    position, partial, events_size = 0, b"", -1

    def flush(text: bytes) -> None:
        sys.stdout.write(printable(text.decode("utf-8", "replace")))
        sys.stdout.flush()

    try:
        while True:
            # Whether it ended is decided before the last read, so that read sees everything.
            ended = (run_dir / "result.json").exists() or catalog.read_row(run_dir).state == catalog.CRASHED
            size = _size(run_dir / "events.jsonl")
            if size != events_size or current is None or ended:
                events_size = size
                path = catalog.rank_log(run_dir, rank)
                if path is not None and path != current:
                    if current is not None:
                        flush(partial)
                        partial = b""
                        print(f"--- rank {rank} restarted: {path.name} ---", flush=True)
                    current, position = path, 0
            if current is not None:
                with contextlib.suppress(FileNotFoundError), open(current, "rb") as f:
                    f.seek(position)
                    data = f.read()
                    position += len(data)
                    *lines, partial = (partial + data).split(b"\n")
                    if lines:
                        flush(b"\n".join(lines) + b"\n")
            if ended:
                flush(partial)
                return 0
            time.sleep(interval)
    except KeyboardInterrupt:
        flush(partial)
        return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, exit 2: what was wrong, and where to read more."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _token_options(sp: argparse.ArgumentParser, default: str) -> None:
    group = sp.add_mutually_exclusive_group()
    group.add_argument("--token", default=None, help=f"the run's secret ({default})")
    group.add_argument(
        "--token-file",
        default=None,
        metavar="PATH",
        help="read the token from this file (one line), so that it does not show in ps",
    )


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="orch", description="Run and watch PyTorch DDP training.")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        for name in ("fn", "steps", "config", "rdzv_port", "heartbeat_timeout"):
            add_flag(sp, name)
        sp.add_argument("--refresh", type=_seconds, default=0.5, help="dashboard refresh interval (s)")

    r = sub.add_parser("run", help="start a master and N local workers, with a live dashboard")
    add_flag(r, "world_size", "-n", default=None, help="number of worker processes (default 4)")
    add_flag(r, "master_port")
    add_flag(r, "run_root")
    add_flag(r, "max_restarts")
    r.add_argument(
        "--detach",
        action="store_true",
        help="start the run under a supervisor of its own and return: it outlives this command "
        "(attach with orch.attach(RUN_ID))",
    )
    sl = r.add_argument_group("on a Slurm cluster (from its login node)")
    sl.add_argument("--slurm", action="store_true", help="run the ranks as one Slurm batch job")
    sl.add_argument("--nodes", type=_positive, default=None, help="nodes (default 1)")
    sl.add_argument("--tasks-per-node", type=_positive, default=None, help="ranks per node (default 1)")
    sl.add_argument("--partition", default=None, help="Slurm partition (default: the cluster's)")
    sl.add_argument("--time", default=None, help="the job's time limit (default 1:00:00)")
    sl.add_argument("--gpus-per-node", type=_positive, default=None, help="GPUs per node (one rank each)")
    sl.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        help="one more sbatch option, e.g. --sbatch-arg=--qos=high",
    )
    common(r)
    r.set_defaults(func=cmd_run)

    _sweep_cli.add_parser(sub, seconds=_seconds)

    m = sub.add_parser("master", help="serve a run for workers started elsewhere")
    add_flag(m, "world_size", "--workers", flag="--world-size", default=None, required=True)
    add_flag(m, "master_host")
    _token_options(m, "default $ORCH_TOKEN, else a new one")
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

    w = sub.add_parser("worker", help="join the run of a master")
    w.add_argument(
        "--master",
        default=None,
        help="HOST:PORT of the master (default $ORCH_MASTER: under torchrun, whose parser refuses "
        "--master after the script unless a -- comes first)",
    )
    _token_options(w, "default $ORCH_TOKEN")
    w.add_argument("--tls-ca", default=None, help="verify the master's TLS certificate with this CA")
    w.add_argument(
        "--fn",
        default=None,
        type=_target,
        help="training function as package.module:function or path/to/train.py:function, found "
        "from the current folder (default: the one the master names, which runs only with "
        "--tls-ca or --trust-master, unless it is the built-in example)",
    )
    w.add_argument(
        "--fn-file",
        default=None,
        help="the training function as a launch on a cluster wrote it into the run dir (function.pkl), "
        "loaded only once its signature matches the run's token",
    )
    w.add_argument(
        "--trust-master",
        action="store_true",
        help="without --fn, run the function the master names over a plaintext channel "
        "(it imports and runs whatever module the master, or whoever answers at its address, names)",
    )
    w.add_argument(
        "--advertise-addr",
        default=None,
        help="address the other ranks reach this host on (default: the route to the master)",
    )
    w.add_argument(
        "--nproc-per-node",
        type=_positive,
        default=None,
        help="worker processes to start on this host (one per GPU where there are GPUs; default 1); "
        "not under a launcher, which starts one orch worker per rank",
    )
    w.add_argument(
        "--launcher",
        choices=LAUNCHER_CHOICES,
        default="auto",
        help="where this worker's rank comes from: auto (torchrun's RANK/WORLD_SIZE when "
        "TORCHELASTIC_RUN_ID is set, else Slurm's SLURM_PROCID/SLURM_NTASKS in an srun task, "
        "else the master's next free rank), torchrun or slurm (read those variables), none (the master's)",
    )
    w.add_argument(
        "--log-dir",
        default=None,
        help="write each rank's output to LOG_DIR/<worker id>.log (with --nproc-per-node; default: "
        "this command's output)",
    )
    w.add_argument("--threads", type=_positive, default=None, help="torch threads for each worker")
    w.add_argument("--timeout", type=_seconds, default=60.0, help="seconds to wait for the master")
    w.add_argument(
        "--run-root",
        default="runs",
        help="where this worker keeps checkpoints and error files (run-root/<run-id>/)",
    )
    w.set_defaults(func=cmd_worker)

    s = sub.add_parser("status", help="print a master's run state once")
    s.add_argument("--master", required=True, help="HOST:PORT of the master")
    _token_options(s, "default $ORCH_TOKEN")
    s.add_argument("--tls-ca", default=None, help="verify the master's TLS certificate with this CA")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--timeout", type=_seconds, default=5.0, help="seconds to wait for the master")
    s.set_defaults(func=cmd_status)

    def run_root(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--run-root", default="runs", help="where the run directories are (default runs)")

    def run_arg(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("run", metavar="RUN", help="a run id under --run-root (or its start), or a run dir")

    ls = sub.add_parser("runs", help="list the runs under --run-root, newest first")
    run_root(ls)
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.add_argument("--state", default=None, type=str.upper, help="only the runs in this state")
    ls.add_argument("--sweep", default=None, help="only the runs of this sweep")
    ls.set_defaults(func=cmd_runs)

    sh = sub.add_parser("show", help="one run: its config, attempts, ranks and root cause")
    run_arg(sh)
    run_root(sh)
    sh.set_defaults(func=cmd_show)

    lg = sub.add_parser("logs", help="a worker's log of a run")
    run_arg(lg)
    lg.add_argument("--rank", type=_rank, default=0, help="whose log (default rank 0)")
    lg.add_argument("--follow", "-f", action="store_true", help="print what comes until the run ends")
    run_root(lg)
    lg.set_defaults(func=cmd_logs)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        code: int = args.func(args)
    except (ConfigError, MasterUnavailable, OrchError) as e:
        # The message may quote what a master or a worker sent: shown, not obeyed.
        print(f"orch {args.command}: error: {printable(str(e))}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    except KeyboardInterrupt:
        print(f"orch {args.command}: aborted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
