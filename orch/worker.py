"""``python -m orch.worker ARGS`` is ``orch worker ARGS``: the entry point torchrun and srun name.

Under torchrun, ``torchrun ... -m orch.worker -- --master HOST:PORT`` (or ORCH_MASTER in the
environment): without the ``--`` torchrun's own parser takes ``--master`` for an
abbreviation of its ``--master-addr`` and refuses it. Some Pythons pass the ``--`` on.
The worker itself is :mod:`orch.runtime.worker`.
"""

from __future__ import annotations

import sys

from orch.cli import main as cli_main


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return cli_main(["worker", *(args[1:] if args[:1] == ["--"] else args)])


if __name__ == "__main__":
    sys.exit(main())
