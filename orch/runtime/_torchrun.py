"""torchrun's contract in a rank: its environment, and the process group its code makes.

Code written for torchrun (a script, Accelerate, Lightning, the HF Trainer) finds its place
in the world in the environment torchrun sets, and makes the process group itself:

- :func:`environment` is what every rank carries: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
  ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``ROLE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``,
  ``TORCHELASTIC_RUN_ID``, ..., consistent with ``ctx.rank`` and ``ctx.local_rank``. Libraries
  that find ``LOCAL_RANK`` set take the processes as started for them (Lightning no longer
  re-executes the program for its "local rank 1"), and read the world size from it.
- :class:`GroupAdopter` stands in for ``torch.distributed.init_process_group`` and
  ``destroy_process_group``. The ranks of an orch run meet through orch's own rendezvous (a
  file in the 0700 run dir on one host, rank 0's store bound to the ranks' address across
  hosts), so a call to ``init_process_group`` joins orch's group, whatever ``init_method``
  it names: made at that call for a script (with the call's backend and timeout), or already
  made for a function of ``ctx``. A call that asks for another world size, rank or backend
  than the run's is an error that says so. ``destroy_process_group()`` lets go of the
  default group without tearing it down: orch ends it with the rank, after the rank reported
  its end, so a destructor that blocks (gloo's may wait for its peers, holding the GIL, which
  stops the heartbeat thread too) never makes a finished rank hang or look lost. A group the
  code made itself with ``new_group`` is destroyed as asked.

``MASTER_ADDR`` is rank 0's address; ``MASTER_PORT`` is the port of orch's store where ranks
meet over TCP (several hosts, or a ``rdzv_port`` named), else a free port chosen at launch
that nothing of orch listens on: a library opening a store of its own there opens it as it
would under torchrun (see docs/security.md).
"""

from __future__ import annotations

import datetime
import logging
import sys
from collections.abc import Callable
from typing import Any

from orch.runtime import current

log = logging.getLogger(__name__)

# The variables torchrun sets in each worker, which orch sets in each rank.
VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_NAME",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_USE_AGENT_STORE",
)


def environment(
    *,
    rank: int,
    local_rank: int,
    world_size: int,
    local_world_size: int,
    run_id: str,
    attempt: int,
    master_addr: str,
    master_port: int,
) -> dict[str, str]:
    """torchrun's variables for one rank. Hosts run ``local_world_size`` ranks each, numbered
    host by host (the master gives a host's ranks one block), so ``GROUP_RANK`` is the host's
    place: ``RANK == GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK``."""
    local_world_size = max(1, local_world_size)
    values = {
        "RANK": rank,
        "LOCAL_RANK": local_rank,
        "WORLD_SIZE": world_size,
        "LOCAL_WORLD_SIZE": local_world_size,
        "GROUP_RANK": rank // local_world_size,
        "GROUP_WORLD_SIZE": max(1, -(-world_size // local_world_size)),
        "ROLE_NAME": "default",
        "ROLE_RANK": rank,
        "ROLE_WORLD_SIZE": world_size,
        "MASTER_ADDR": master_addr.strip("[]"),
        "MASTER_PORT": master_port,
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": max(0, attempt - 1),
        # torch's env:// would otherwise dial torchrun's agent store; orch's group is joined instead.
        "TORCHELASTIC_USE_AGENT_STORE": "False",
    }
    return {name: str(value) for name, value in values.items()}


def backends(text: str) -> set[str]:
    """The communication backends a backend string names: ``"cpu:gloo,cuda:nccl"`` ->
    ``{"gloo", "nccl"}``, ``"gloo"`` -> ``{"gloo"}``."""
    names = set()
    for part in str(text).lower().split(","):
        name = part.rsplit(":", 1)[-1].strip()
        if name:
            names.add(name)
    return names


Make = Callable[[str | None, datetime.timedelta | None, Any], None]

_REAL: dict[str, Any] = {}  # torch's own init_process_group and destroy_process_group


def _torch_c10d() -> Any:
    import torch.distributed.distributed_c10d as c10d

    if not _REAL:  # the first look, before any stand-in is installed
        _REAL["init"], _REAL["destroy"] = c10d.init_process_group, c10d.destroy_process_group
    return c10d


def real_init_process_group(*args: Any, **kwargs: Any) -> None:
    """torch's ``init_process_group``, whatever stands in for it."""
    _torch_c10d()
    _REAL["init"](*args, **kwargs)


class GroupAdopter:
    """``init_process_group`` and ``destroy_process_group`` as a rank of an orch run sees them.

    ``make(backend, timeout, device_id)`` makes orch's default group when the code asks for
    one and none is up yet (a script); ``install`` puts the stand-ins in place of torch's.
    """

    def __init__(self, *, rank: int, world_size: int, make: Make | None = None, store: Any = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self._make = make
        self._store = store  # orch's rendezvous store, which torch's env:// and tcp:// are given
        self.joined = 0  # calls of init_process_group answered with orch's group
        self.released = 0  # calls of destroy_process_group() that let go of it
        self.rendezvous_calls = 0  # torch rendezvous (env://, tcp://) answered with orch's store
        self._real_init: Any = None
        self._real_destroy: Any = None

    def install(self) -> GroupAdopter:
        """Stand in for torch's functions wherever they are bound: ``torch.distributed``,
        ``distributed_c10d`` and every module that bound them by name at its import
        (``device_mesh``'s ``init_device_mesh`` calls its own ``init_process_group``; so may a
        library's). Modules imported later bind the stand-ins. torch's ``env://`` and ``tcp://``
        rendezvous, which open a TCP store on ``MASTER_PORT`` on every interface, are given
        orch's store instead (:meth:`rendezvous`)."""
        _torch_c10d()
        self._real_init, self._real_destroy = _REAL["init"], _REAL["destroy"]
        swaps = {
            "init_process_group": (self._real_init, self.init_process_group),
            "destroy_process_group": (self._real_destroy, self.destroy_process_group),
        }
        for module in list(sys.modules.values()):
            names = getattr(module, "__dict__", None)
            if not isinstance(names, dict):
                continue
            for name, (real, stand_in) in swaps.items():
                if names.get(name) is real:
                    names[name] = stand_in
        if self._store is not None:
            import importlib

            # torch.distributed.rendezvous is also a function's name in torch.distributed.
            rdzv = importlib.import_module("torch.distributed.rendezvous")
            handlers: dict[str, Any] = rdzv._rendezvous_handlers
            for scheme in ("env", "tcp"):
                handlers[scheme] = self.rendezvous
        return self

    def rendezvous(self, url: str, timeout: Any = None, **kwargs: Any) -> Any:
        """torch's ``env://`` and ``tcp://`` rendezvous in a rank: orch's store (under a prefix of
        its own), never a TCP store of the rank's on ``MASTER_PORT``. Reached only by a path that
        calls torch's own ``init_process_group`` (one bound where orch could not see it) or
        ``torch.distributed.rendezvous`` itself; it is said in the rank's log."""
        from torch.distributed.distributed_c10d import PrefixStore

        self.rendezvous_calls += 1
        where = url.split("?", 1)[0]
        text = (
            f"rank {self.rank}: a torch.distributed rendezvous ({where}) was asked for outside orch's "
            "init_process_group (torch's own, bound where orch could not stand in for it): it was "
            "given the run's store, so that no rank serves a TCP store on MASTER_PORT"
        )
        ctx = current.context()
        if ctx is not None:
            ctx.warn(text)  # the rank's log, its row of the panel, the run's events
        else:
            log.warning("%s", text)
        yield PrefixStore(f"orch-rendezvous/{self.rendezvous_calls}", self._store), self.rank, self.world_size
        raise RuntimeError(f"{where}: orch's rendezvous is not re-entered (the run restarts as a whole)")

    def init_process_group(
        self,
        backend: Any = None,
        init_method: str | None = None,
        timeout: datetime.timedelta | None = None,
        world_size: int = -1,
        rank: int = -1,
        store: Any = None,
        group_name: str = "",
        pg_options: Any = None,
        device_id: Any = None,
        **kwargs: Any,
    ) -> None:
        import torch.distributed.distributed_c10d as c10d

        self._check("world_size", world_size, self.world_size)
        self._check("rank", rank, self.rank)
        if not c10d.is_initialized():
            if self._make is None:  # not a rank's group to make (a stand-in left installed)
                self._real_init(
                    backend, init_method, timeout, world_size, rank, store, group_name, pg_options,
                    device_id, **kwargs,
                )  # fmt: skip
                return
            self._make(None if backend is None else str(backend), timeout, device_id)
            self.joined += 1
            log.info("rank %d: init_process_group(%s) made the run's process group", self.rank, backend)
            return
        have = str(c10d.get_backend())
        if backend is not None and str(backend) and not backends(str(backend)) <= backends(have):
            raise RuntimeError(
                f"init_process_group(backend={str(backend)!r}) in rank {self.rank} of an orch run whose "
                f"process group is {have!r}: orch made the ranks' group already, and this call joins it. "
                f"Ask for {have!r} (or leave backend out), or write the training function without ctx "
                "(a script) so that its own init_process_group makes the group with the backend it names"
            )
        self.joined += 1

    def destroy_process_group(self, group: Any = None) -> None:
        import torch.distributed.distributed_c10d as c10d

        if group is None or group is c10d.GroupMember.WORLD:
            self.released += 1  # orch ends it with the rank (see the module's docstring)
            return
        self._real_destroy(group)

    def destroy_all(self) -> None:
        """End every group of this rank: orch's own tear-down, once the rank reported its end."""
        import torch.distributed.distributed_c10d as c10d

        if c10d.is_initialized():
            self._real_destroy()

    def _check(self, name: str, asked: Any, have: int) -> None:
        if asked is None or asked == -1 or asked == have:
            return
        size = f"{self.world_size} rank{'s' if self.world_size != 1 else ''}"
        raise ValueError(
            f"init_process_group({name}={asked!r}) in rank {self.rank} of an orch run of {size}: orch "
            f"started the ranks and joins this call to their process group, as rank {self.rank} of "
            f"{self.world_size}; leave {name} out (or read it from ${name.upper()}, which orch sets as "
            f"torchrun does), or launch the run with the world size this code expects"
        )
