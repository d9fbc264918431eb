"""A rank's random state is its own, as a fresh process's is under torchrun.

orch starts ranks by forking a forkserver that imported torch (and numpy) once: a forked
child is a copy, generators included, so without this every rank of every launch would
draw the same ``torch.randn`` and ``np.random.rand()`` (dropout masks, random crops, noise,
an unseeded sampler: the same on every rank, the same in two unrelated runs). CPython
reseeds ``random`` after a fork; torch and numpy do not.

:func:`reseed` runs in each rank before the user's code, at its start (a gang's rank at its
first call):

- without a seed, each generator is seeded from the OS, as a fresh process's is: torch's CPU
  generator, numpy's global one (if numpy is imported; a later import starts fresh) and
  ``random``. CUDA's generators are made, and seeded from the OS, on their first use in the
  rank (the forkserver never touches CUDA); ones already made in the rank are reseeded.
- with ``seed`` (``orch.launch(..., seed=s)``, ``orch run --seed s``), every generator of
  rank ``r`` is seeded with ``s + r``, as Accelerate's ``set_seed(s, device_specific=True)``
  does: the run is reproducible, and the ranks still draw apart.
"""

from __future__ import annotations

import os
import random
import sys

SEED_MAX = 2**63 - 1  # torch.manual_seed takes up to a signed 64-bit value


def rank_seed(seed: int, rank: int) -> int:
    """The seed rank ``rank`` of a run launched with ``seed`` uses."""
    return (seed + rank) % (SEED_MAX + 1)


def reseed(rank: int, seed: int | None) -> int | None:
    """Seed this rank's generators (see the module's docstring); returns the rank's seed, or
    None when they were seeded from the OS."""
    import torch

    if seed is None:
        random.seed()  # from os.urandom
        torch.default_generator.seed()  # from the OS
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()  # from the OS
        if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # never so in a forked rank
            for device in range(torch.cuda.device_count()):
                with torch.cuda.device(device):
                    torch.cuda.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        return None
    mine = rank_seed(seed, rank)
    random.seed(mine)
    torch.manual_seed(mine)  # the CPU generator and every CUDA device's (lazily)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(mine % 2**32)
    return mine
