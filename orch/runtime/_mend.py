"""Freeing and remaking a gang's process group in the same processes (see :mod:`orch.runtime.gang`).

A call that fails on one rank can leave its peers inside a collective that will never finish:
gloo waits for the failed rank's part until the group's timeout (30 minutes by default). torch
2.13's gloo cannot be aborted from Python (``ProcessGroup.abort()``, ``shutdown()`` and
``_abort_process_group`` return and leave the waiting collective waiting), but a collective
waits on its TCP connections to its peers: shutting them down (``shutdown(2)`` on the
connected sockets the group made; its listening socket is left alone, gloo's listener thread
aborts the process if that one fails) makes the waiting collective fail at once with
"Connection closed by peer", in this rank and in its peers. The group is then broken
everywhere, and the ranks make a new one among the same processes at their next call
(:func:`remake`), through a new file store, and rewrap the ``ctx.ddp`` models on it.

Which sockets are the group's: those that appeared in ``/proc/self/fd`` while it was made
(:func:`sockets` before and after). The sockets of a group the code made itself later
(``dist.new_group`` in a cell) are not among them; such a group is destroyed with the others at
a mend, and the code makes it again.
"""

from __future__ import annotations

import logging
import os
import socket
import weakref
from typing import Any

log = logging.getLogger(__name__)

Sockets = dict[int, str]  # fd -> its link in /proc/self/fd ("socket:[inode]"): the same socket still
COLLECTIVE_WORDS = ("gloo", "nccl", "processgroup", "connection closed by peer", "connection reset by peer")


def sockets() -> Sockets:
    """This process's open sockets."""
    found: Sockets = {}
    with os.scandir("/proc/self/fd") as entries:
        for entry in entries:
            try:
                link = os.readlink(entry.path)
            except OSError:
                continue
            if link.startswith("socket:"):
                found[int(entry.name)] = link
    return found


def made_since(before: Sockets) -> Sockets:
    """The sockets opened since ``before`` was read."""
    return {fd: link for fd, link in sockets().items() if before.get(fd) != link}


def free(made: Sockets) -> int:
    """Shut down the connected sockets among ``made`` that are still the ones it names: every
    collective of their group that waits on them fails now, here and in the peers. Returns how
    many were shut down."""
    n = 0
    for fd, link in made.items():
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != link:
                continue  # closed since, and the number reused for something else
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                continue  # the group's listener: gloo ends the process when it fails
            sock.shutdown(socket.SHUT_RDWR)
            n += 1
        except OSError:
            pass  # not connected (any more)
        finally:
            sock.close()  # the duplicate; the group's own descriptor stays its own
    return n


def abort_nccl() -> None:
    """On GPUs: NCCL's collectives wait on no socket of this process, but torch can abort an
    NCCL group (``_abort_process_group``), which frees them. Nothing on gloo."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_backend() != "nccl":
        return
    try:
        dist.distributed_c10d._abort_process_group()
    except Exception as e:  # an abort that cannot be done: the gang's wait for the rank decides
        log.warning("could not abort the NCCL process group: %s", e)


def from_collective(error: BaseException | None) -> bool:
    """``error`` (or one it was raised from) came out of a collective: the group's state is
    in doubt, so the gang remakes it."""
    import torch.distributed as dist

    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, dist.DistError):
            return True
        text = str(error).lower()
        if isinstance(error, RuntimeError) and any(w in text for w in COLLECTIVE_WORDS):
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


def sequence(groups: list[Any]) -> list[int]:
    """How many collectives each group has issued here (its peers' counts match while no
    collective is left half done); -1 where torch does not say."""
    counts = []
    for group in groups:
        try:
            counts.append(int(group._get_sequence_number_for_group()) if group is not None else 0)
        except (AttributeError, RuntimeError, ValueError):
            counts.append(-1)
    return counts


class Wrapped:
    """The DistributedDataParallel models ``ctx.ddp`` made in a gang's ranks, weakly, with
    the arguments each was made with, so a mend can rewrap them on the new group."""

    def __init__(self) -> None:
        self._made: list[tuple[weakref.ref[Any], dict[str, Any]]] = []

    def add(self, model: Any, kwargs: dict[str, Any]) -> None:
        self._made.append((weakref.ref(model), dict(kwargs)))

    def live(self) -> list[tuple[Any, dict[str, Any]]]:
        out = [(m, kw) for ref, kw in self._made if (m := ref()) is not None]
        self._made = [(weakref.ref(m), kw) for m, kw in out]
        return out

    def rewrap(self) -> int:
        """Make each live model's DDP again in place, on the current default group: every
        reference to it (``ctx.state``, an optimizer's closure) stays good; its parameters are
        broadcast from rank 0 as at any wrap. Returns how many were rewrapped."""
        from torch import nn

        n = 0
        for model, kwargs in self.live():
            kwargs.pop("process_group", None)  # the old group is gone: the new default one
            nn.parallel.DistributedDataParallel.__init__(model, model.module, **kwargs)
            n += 1
        return n
