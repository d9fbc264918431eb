"""``python -m orch ARGS`` is ``orch ARGS`` (``torchrun ... -m orch worker HOST:PORT`` too)."""

from __future__ import annotations

import sys

from orch.cli import main

if __name__ == "__main__":
    sys.exit(main())
