"""What the ranks' training functions returned, read back from a run dir.

Each rank that returned something other than None wrote ``values/rank-<rank>.a<attempt>.pt``
(:mod:`orch.runtime.values`), or ``.error`` saying why it could not. :class:`Returned` reads
the run's final attempt's, when asked: ``value`` loads rank 0's alone, ``values`` every rank's,
in rank order (None for a rank that returned None). The files are loaded with
``torch.load(weights_only=False, map_location="cpu")``: a value is any object the function
returned, and unpickling it runs what it names, so only files the run's own user wrote, as
regular files in the 0700 run dir, are read (:func:`orch.record.owned.open_own`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orch._text import size_text
from orch.errors import OrchError
from orch.record.owned import open_own

VALUES_DIR = "values"
VALUE_CAP = 1 << 30  # bytes a rank's returned value may take, by default (1 GiB)


def value_name(rank: int, attempt: int) -> str:
    return f"rank-{rank}.a{attempt}.pt"


def error_name(rank: int, attempt: int) -> str:
    return f"rank-{rank}.a{attempt}.error"


def words(n: int) -> str:
    """A size as the messages say it: ``1.1 GB (1,073,741,824 bytes)``."""
    return f"{size_text(n)} ({n:,} bytes)"


class ValueNotReturned(OrchError):
    """A rank's value could not come back (it did not pickle, or it was over the cap)."""


class Returned:
    """The values of one run's ranks, loaded when asked for (each at most once)."""

    def __init__(self, run_dir: Path | None, world_size: int, attempt: int) -> None:
        self.run_dir, self.world_size, self.attempt = run_dir, world_size, attempt
        self._loaded: dict[int, Any] = {}

    def of(self, rank: int) -> Any:
        """What rank ``rank`` returned (None when it returned None); raises
        :class:`ValueNotReturned` naming why when it could not come back."""
        if rank in self._loaded:
            return self._loaded[rank]
        if self.run_dir is None:
            raise OrchError(
                "this run has no run dir here (a master known by its address): its ranks' values "
                "are in the run dir where they ran"
            )
        folder = self.run_dir / VALUES_DIR
        try:
            with open_own(folder / error_name(rank, self.attempt)) as f:
                raise ValueNotReturned(f.read(64 * 1024).decode(errors="replace"))
        except FileNotFoundError:
            pass
        try:
            f = open_own(folder / value_name(rank, self.attempt))
        except FileNotFoundError:
            value = None
        else:
            import torch

            with f:
                value = torch.load(f, map_location="cpu", weights_only=False)
        self._loaded[rank] = value
        return value

    @property
    def value(self) -> Any:
        return self.of(0)

    @property
    def values(self) -> list[Any]:
        return [self.of(rank) for rank in range(self.world_size)]
