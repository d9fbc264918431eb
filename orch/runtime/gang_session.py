"""What a rank of a gang keeps from one call to the next (see :mod:`orch.runtime.gang`)."""

from __future__ import annotations

import types
import weakref
from dataclasses import dataclass, field
from typing import Any

from orch.runtime._mend import Sockets, Wrapped, sequence


@dataclass
class Session:
    """A gang rank's lasting state: its process group is up after the first call (with orch's
    control group), and its namespace (``ctx.state``; a ``%%orch`` cell's globals) stays."""

    group_up: bool = False
    watched: bool = False  # the rank ends with the process that started the gang (and serves its masters)
    seeded: bool = False  # its generators were seeded at its first call (see orch.runtime._seeding)
    control: Any = None
    state: types.SimpleNamespace = field(default_factory=types.SimpleNamespace)
    rendezvous: str = ""  # the file store the group was made through: another one means remake it
    sockets: Sockets = field(default_factory=dict)  # the group's connections (orch.runtime._mend)
    wrapped: Wrapped = field(default_factory=Wrapped)  # ctx.ddp's models, rewrapped at a remake
    models: list[weakref.ref[Any]] = field(default_factory=list)  # ctx.ddp's modules, for checksums
    timed: list[weakref.ref[Any]] = field(default_factory=list)  # DDP models whose collectives are timed
    # This call's: its collectives were freed (a peer failed), the user's code is running now
    # (an abort may interrupt it), and its error came out of a collective.
    freed: bool = False
    in_user_code: bool = False
    collective_error: bool = False

    def new_call(self) -> None:
        self.freed = self.in_user_code = self.collective_error = False

    def outcome(self, code: int) -> dict[str, Any]:
        """What the rank tells the gang's launcher at the end of a call: its exit code, and
        what says whether its group is whole (the launcher compares the ranks' counts)."""
        import torch.distributed as dist

        groups = [dist.group.WORLD, self.control] if self.group_up and dist.is_initialized() else []
        return {
            "code": code,
            "freed": self.freed,
            "collective_error": self.collective_error,
            "sequence": sequence(groups),
        }

    def keep_models(self, models: list[Any], timed: list[Any]) -> None:
        """The call's models, weakly: the next call's ``ctx`` counts them (checksums, timings)
        while the code keeps them."""
        self.models = [weakref.ref(m) for m in models]
        self.timed = [weakref.ref(m) for m in timed]

    def live(self, refs: list[weakref.ref[Any]]) -> list[Any]:
        return [m for r in refs if (m := r()) is not None]
