"""What a rank of a gang keeps from one call to the next (see :mod:`orch.runtime.gang`)."""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Session:
    """A gang rank's lasting state: its process group is up after the first call (with orch's
    control group), and its namespace (``ctx.state``; a ``%%orch`` cell's globals) stays."""

    group_up: bool = False
    seeded: bool = False  # its generators were seeded at its first call (see orch.runtime._seeding)
    control: Any = None
    state: types.SimpleNamespace = field(default_factory=types.SimpleNamespace)
    broken: bool = False  # a call failed: its collectives may be left half done, so the rank ends
