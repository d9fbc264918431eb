"""``python -m orch.worker ARGS`` is ``orch worker ARGS``: the entry point torchrun and srun name.

Under torchrun, ``torchrun --nproc-per-node K -m orch.worker HOST:PORT [flags]`` (or
ORCH_MASTER in the environment): the master's address comes first, as an argument, since
torchrun's own parser takes ``--master`` for an abbreviation of its ``--master-addr`` and
refuses it wherever it stands. A ``--`` before the worker's arguments is dropped. It
parses the worker's flags alone (:mod:`orch._worker_cli`), so a worker host loads no master,
launcher or view; the worker itself is :mod:`orch.runtime.worker`.
"""

from __future__ import annotations

import sys

from orch._worker_cli import main as worker_main


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return worker_main(args[1:] if args[:1] == ["--"] else args)


if __name__ == "__main__":
    sys.exit(main())
