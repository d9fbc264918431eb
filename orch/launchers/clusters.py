"""Where a run's ranks can run besides this machine: the cluster kinds, found in one place.

A ``cluster=`` object (``orch.Slurm(...)``) holds one kind's options. What orch needs of the
kind is a :class:`ClusterKind`, which its package registers: the options' class, the
:class:`~orch.launchers.launcher.Launcher` that starts, watches and ends the run's ranks (or
host agents), the address the master binds so they reach it, the checks of this machine run
before anything starts, and, for ``orch.gang(..., cluster=...)``, ranks that stay up across
calls. The run, the spec and the gang ask this module, never a kind by name. ::

    # a kind's package, e.g. orch/launchers/slurm/kind.py
    KIND = ClusterKind(name="slurm", options=Slurm, launcher=_launcher, master_host=..., check=...)

    # pyproject.toml of a package that adds a kind from outside orch
    [project.entry-points."orch.clusters"]
    mykind = "mypackage.kind:KIND"

Kinds are found in :data:`BUILT_IN` and in the ``orch.clusters`` entry-point group of the
installed packages, once, when a cluster is first named; :func:`register` adds one at run time.
A kind that fails to load is logged and left out: it never breaks the others.

A kind may also bring its flags for ``orch run`` (:class:`ClusterFlags`): ``--slurm ...``,
``--ray ADDRESS ...``. The command asks every kind for its flags and its cluster, never a kind
by name.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from orch.errors import ConfigError

log = logging.getLogger(__name__)

ENTRY_POINTS = "orch.clusters"
BUILT_IN = ("orch.launchers.slurm.kind:KIND", "orch.launchers.ray.kind:KIND")


@runtime_checkable
class Cluster(Protocol):
    """What any ``cluster=`` object is: how many ranks it runs, and a line that says where."""

    @property
    def world_size(self) -> int: ...

    def describe(self) -> str: ...


class ClusterFlags(Protocol):
    """A cluster kind's flags on ``orch run``, as its ``flags.py`` defines them.

    - ``selector``: the flag that picks the kind (``--slurm``, ``--ray ADDRESS``); its value,
      ``args.<its name>``, is false or None when it was not given;
    - ``sizes``: what the run's world size is made of, in flags (``--nodes x --tasks-per-node``),
      for the command's refusal of a ``--workers`` that differs;
    - ``add(parser)``: adds the kind's argument group (its selector and its own flags) to the
      command's parser;
    - ``build(args)``: the kind's ``cluster=`` object from the parsed flags; None when the
      selector was not given, a :class:`~orch.errors.ConfigError` naming the selector when the
      kind's own flags were given without it (:func:`flags_given` finds them); a bad value is
      refused by the options' own checks.

    Flags shared by kinds are the command's, defined there once, and each kind's ``build``
    reads them: ``args.nodes`` (None when not given: the kind's default) and
    ``args.master_addr`` (the address of this machine the nodes reach; None: the kind's
    default). Nothing a kind's flags import may import the cluster's client library: ``orch
    --help`` builds every kind's flags.
    """

    @property
    def selector(self) -> str: ...

    @property
    def sizes(self) -> str: ...

    def add(self, parser: argparse.ArgumentParser) -> None: ...

    def build(self, args: argparse.Namespace) -> Any | None: ...


def flags_given(args: argparse.Namespace, flags: Iterable[str]) -> list[str]:
    """Those of ``flags`` (``--tasks-per-node``) given on the command line: their value (at
    ``args.tasks_per_node``) is not the unset default (None, False, an empty list)."""
    values = [(f, getattr(args, f.lstrip("-").replace("-", "_"), None)) for f in flags]
    return [f for f, v in values if v is not None and v is not False and v != []]  # 0 is a value


def _no_checks(cluster: Any) -> None:
    """A kind with nothing of this machine to check before it starts."""


@dataclass(frozen=True)
class ClusterKind:
    """One cluster kind, as its package registers it.

    - ``options``: the class of its ``cluster=`` objects (checked when made);
    - ``launcher()``: the :class:`~orch.launchers.launcher.Launcher` class of its runs, imported
      only when a run uses the kind (a rank or ``import orch`` loads none of it);
    - ``master_host(cluster)``: the address the run's master binds, one the nodes reach;
    - ``check(cluster)``: what this machine must have (a scheduler's commands, a client
      library), a :class:`~orch.errors.ConfigError` saying what is missing, before any start;
    - ``gang_job(cluster, gang_id, restarts, tls)``: ranks that stay up across a gang's calls,
      each dialing back to the gang (an object with ``start(world_size, folder, timeout, say)``
      returning one connection per rank, in rank order, and ``end()``); None: no gangs;
    - ``place_rank(spec, cluster, token)``: a gang call's spec made right for a rank on a node
      (its environment, threads, local rank);
    - ``cli``: its flags on ``orch run`` (:class:`ClusterFlags`); None: the kind is launched
      from Python only.
    """

    name: str
    options: type
    launcher: Callable[[], type]
    master_host: Callable[[Any], str]
    check: Callable[[Any], None] = _no_checks
    gang_job: Callable[..., Any] | None = None
    place_rank: Callable[[Any, Any, str], None] | None = None
    cli: ClusterFlags | None = None


class _Registry:
    def __init__(self) -> None:
        self._kinds: dict[str, ClusterKind] = {}
        self._found = False
        self._lock = threading.Lock()

    def register(self, kind: ClusterKind) -> None:
        if not isinstance(kind, ClusterKind):
            raise TypeError(f"a cluster kind is a ClusterKind, got {type(kind).__name__}")
        with self._lock:
            held = self._kinds.get(kind.name)
            if held is not None and held.options is not kind.options:
                raise ConfigError(
                    f"two cluster kinds are named {kind.name!r}: {held.options.__module__}."
                    f"{held.options.__qualname__} and {kind.options.__module__}.{kind.options.__qualname__}"
                )
            self._kinds[kind.name] = kind

    def kinds(self) -> list[ClusterKind]:
        self._find()
        with self._lock:
            return list(self._kinds.values())

    def _find(self) -> None:
        with self._lock:
            if self._found:
                return
            self._found = True
        targets = [("built-in", target) for target in BUILT_IN]
        try:
            targets += [(ep.name, ep) for ep in entry_points(group=ENTRY_POINTS)]  # type: ignore[misc]
        except Exception as e:  # broken metadata of some package: the built-in kinds still work
            log.warning("could not read the %s entry points: %s", ENTRY_POINTS, e)
        for name, target in targets:
            try:
                kind = _load(target) if isinstance(target, str) else target.load()
                self.register(kind)
            except Exception as e:
                log.warning("cluster kind %s (%s) could not be loaded and is left out: %s", name, target, e)


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


_REGISTRY = _Registry()


def register(kind: ClusterKind) -> None:
    """Add a cluster kind (as an entry point of the ``orch.clusters`` group does)."""
    _REGISTRY.register(kind)


def kinds() -> list[ClusterKind]:
    """Every cluster kind orch knows: the built-in ones, the installed packages', the registered."""
    return _REGISTRY.kinds()


def kind_of(cluster: Any) -> ClusterKind:
    """The kind of a ``cluster=`` object, or a ConfigError naming the kinds there are."""
    for kind in kinds():
        if isinstance(cluster, kind.options):
            return kind
    known = ", ".join(f"{k.options.__qualname__}(...) for {k.name}" for k in kinds()) or "none"
    raise ConfigError(
        f"cluster must be the options of a cluster kind ({known}), got {type(cluster).__name__}; "
        f"a kind from another package is found through the {ENTRY_POINTS!r} entry points"
    )
