"""``orch worker``: join the run of a master, as one rank or as a host's agent for K ranks.

Also ``python -m orch.worker`` (what torchrun and srun start): this module imports the
worker runtime and the wire only, so a worker host loads no master, launcher or view.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any

from orch._cli_common import Parser, positive, run_command, seconds, target, token_of, token_options
from orch.errors import ConfigError
from orch.runtime.function_file import read_function
from orch.runtime.host import run_local_group
from orch.runtime.launcher_env import LAUNCHER_CHOICES, launched_as
from orch.runtime.spec import WorkerSpec
from orch.runtime.target import resolve_fn
from orch.runtime.worker import run_worker
from orch.wire.auth import token_from_env


def add_parser(sub: Any) -> None:
    """``orch worker``'s options."""
    w = sub.add_parser("worker", help="join the run of a master")
    w.add_argument(
        "address",
        nargs="?",
        default=None,
        metavar="HOST:PORT",
        help="the master's address, as orch master printed it (the form torchrun passes on: "
        "torchrun --nproc-per-node K -m orch.worker HOST:PORT)",
    )
    w.add_argument(
        "--master",
        default=None,
        help="HOST:PORT of the master, as the first argument does (default $ORCH_MASTER; torchrun's "
        "parser takes --master for an abbreviation of its --master-addr: give the address first)",
    )
    token_options(w, "default $ORCH_TOKEN")
    w.add_argument("--tls-ca", default=None, help="verify the master's TLS certificate with this CA")
    w.add_argument(
        "--fn",
        default=None,
        type=target,
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
        type=positive,
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
    w.add_argument("--threads", type=positive, default=None, help="torch threads for each worker")
    w.add_argument("--timeout", type=seconds, default=60.0, help="seconds to wait for the master")
    w.add_argument(
        "--run-root",
        default="runs",
        help="where this worker keeps checkpoints and error files (run-root/<run-id>/)",
    )
    w.set_defaults(func=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    if args.address and args.master and args.address != args.master:
        raise ConfigError(f"two masters: {args.address} and --master {args.master}; pass one")
    master = args.address or args.master or os.environ.get("ORCH_MASTER", "")
    if not master:
        raise ConfigError("pass the master's HOST:PORT (the address orch master printed), or set ORCH_MASTER")
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
        fn, sources = read_function(args.fn_file, token_from_env(token_of(args)))

    if fn is None and args.tls_ca is None and not args.trust_master:
        # Said before the worker joins: its refusal, once the master names another function,
        # fails the run of every other rank too.
        print(
            "orch worker: warning: without --fn, --tls-ca or --trust-master this worker runs only "
            "the built-in example; if the master names another training function, it refuses "
            "it and that fails the whole run. Pass --fn package.module:function (the function "
            "the run trains), --tls-ca CA.pem (a master serving TLS) or --trust-master",
            file=sys.stderr,
            flush=True,
        )
    nproc = args.nproc_per_node or 1
    group = f"{socket.gethostname()}-{os.getpid()}" if launched is None and nproc > 1 else ""
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
            token=token_of(args),
            tls_ca=args.tls_ca,
            trust_master=args.trust_master,
            launched=launched,
            group=group,
            log_dir=args.log_dir,
            **({"sources": sources} if sources is not None else {}),
        )
        for i in range(nproc)
    ]
    if args.nproc_per_node is None:
        return run_worker(specs[0])
    # A host agent, even for one rank: it reports a rank's death and restarts it (--max-restarts).
    return run_local_group(specs)


def main(argv: list[str] | None = None) -> int:
    """``orch worker ARGS`` alone: ``python -m orch.worker`` parses only the worker's flags."""
    parser = Parser(prog="orch", description="Join the run of an orch master.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run_command(parser, ["worker", *(sys.argv[1:] if argv is None else argv)])
