"""A sweep as asked, checked before any process starts: :class:`SweepPlan`.

What :func:`orch.sweep` was given (the function, the configs or the space, the search, the
pruner, the order, the options) is validated here, in the notebook cell, with errors that
name the argument; the plan then knows the sweep's name and folder, how many runs fit at
once, each run's threads, the signature that tells this search from an earlier one under
the same name, and how a config becomes a checked :class:`~orch.launchers.spec.LaunchSpec`.
:class:`~orch.experiments.sweep.Sweep` is the sweep as it runs, built on a plan.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from orch.errors import ConfigError
from orch.experiments.metrics import default_mode
from orch.experiments.reuse import code_hash, signature
from orch.experiments.space import RandomSearch, check_arguments, check_space
from orch.launchers.front import RunOptions, spec_of
from orch.launchers.spec import MAX_WORKERS_PER_CORE, LaunchSpec
from orch.record.user_folders import user_folder
from orch.record.writes import check_dir
from orch.runtime.nested import refuse_launch
from orch.runtime.script import Script
from orch.runtime.target import TrainFn

log = logging.getLogger(__name__)

# A pruned sweep's ranks beat this often (seconds), so that a rung's value reaches the sweep, and
# its decision the ranks, within a fraction of a second (a launch's default beat is 0.25 s).
PRUNE_BEAT = 0.1


class SweepPlan:
    """The sweep's arguments, checked, and what follows from them (see the module docstring)."""

    def __init__(
        self,
        train: TrainFn | str | None,
        configs: Sequence[dict[str, Any]] | dict[str, Any],
        *,
        world_size: int = 2,
        parallel: int = 1,
        max_failures: int | None = None,
        run_root: str = "runs",
        name: str | None = None,
        options: RunOptions | None = None,
        trials: int | None = None,
        search: Any = None,
        metric: str = "loss",
        mode: Literal["min", "max"] | None = None,
        prune: Any = None,
        seed: int = 0,
        order: Literal["given", "random"] | None = None,
    ) -> None:
        refuse_launch("orch.sweep")
        self.options: RunOptions = dict(options or {})  # type: ignore[assignment]
        self.configs, self.search, self.prune, self.seed = configs, search, prune, seed
        self.max_failures = max_failures
        self.metric = metric
        self.mode: Literal["min", "max"] = mode or default_mode(metric)
        if self.mode not in ("min", "max"):
            raise ConfigError(f"mode must be 'min' or 'max', got {mode!r}")
        self.searched = isinstance(configs, dict)
        self._check(configs, trials, search, parallel, max_failures, order)
        # A pruner compares each trial with those before it at each rung: a grid written in order
        # (lr 1e-4, 3e-4, ...) would bring it configs that each beat all the earlier ones, and
        # asynchronous halving would keep nearly all of them. Shuffled (seeded), the early trials
        # at each rung come from across the grid. orch.SHA decides a rung on all of them at once.
        judged_one_by_one = prune is not None and not getattr(prune, "synchronous", False)
        self.shuffled = not self.searched and (order == "random" or (order is None and judged_one_by_one))
        self.train = train
        self.beat = PRUNE_BEAT if prune is not None else None
        self.run_root_text = run_root
        self.world_size = world_size
        # The first spec is checked now, before any process starts: a bad config fails the cell.
        self.sample = RandomSearch(configs, seed).next(0) if isinstance(configs, dict) else dict(configs[0])
        first = self.spec(self.sample)
        self.fn_name = first.fn_name
        self.code = code_hash(first.fn, first.fn_name, first.workdir)
        if isinstance(first.fn, Script):
            self.name = name or first.fn.stem
        else:
            self.name = name or first.fn_name.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
        self.run_root = Path(run_root)
        # The study, the rungs (sweep.json): runs/.sweeps/<name>, or in a shared run root this
        # user's own .orch-<uid>/sweeps/<name> (orch.record.user_folders), where no other user's
        # folder or link blocks it. Checked now: one of theirs where this user's should be fails
        # the cell before any process starts, naming it, and nothing is written through it.
        self.folder = user_folder(self.run_root, "sweeps") / self.name
        check_dir(self.folder.parent)
        check_dir(self.folder)
        fit = MAX_WORKERS_PER_CORE * (os.cpu_count() or 1)
        self.at_once = max(1, min(parallel, fit // world_size))
        if self.at_once < parallel:
            log.warning(
                "sweep %s: %d runs of %d ranks at once do not fit this machine (%d ranks at most): "
                "running %d at a time",
                self.name, parallel, world_size, fit, self.at_once,
            )  # fmt: skip
        self.threads = self.options.get("threads") or max(
            1, (os.cpu_count() or 1) // (world_size * self.at_once)
        )
        self.size = trials if trials is not None else len(configs)
        steps = self.options.get("steps")
        self.signature = signature(
            self.fn_name,
            self.code,
            world_size,
            configs,
            "random order" if self.shuffled else search,
            seed,
            metric,
            self.mode,
            prune,
            steps,
        )
        self.steps = steps or self.sample.get("steps")  # a run's step count, as orch reads it

    @staticmethod
    def _check(
        configs: Sequence[dict[str, Any]] | dict[str, Any],
        trials: int | None,
        search: Any,
        parallel: int,
        max_failures: int | None,
        order: str | None,
    ) -> None:
        check_space(configs, trials)
        if not isinstance(configs, dict):
            if search not in (None, "grid"):
                raise ConfigError(
                    f"search={search!r} draws configs from a dict space, like "
                    "{'lr': orch.loguniform(1e-4, 1e-1)}; a list of configs runs as it is (search=None)"
                )
            check_arguments(configs, parallel, max_failures)
            if trials is not None and trials > len(configs):
                raise ConfigError(
                    f"trials={trials} is more than the {len(configs)} configs given: a list runs as it "
                    "is (trials=N runs its first N); draw from a dict space for more"
                )
        else:
            check_arguments([{}], parallel, max_failures)
        if order not in (None, "given", "random"):
            raise ConfigError(
                f"order must be 'random' (configs run in a seeded random order), 'given' (in the list's "
                f"order) or None (random with a pruner that judges trials one by one, else given), got "
                f"{order!r:.60}"
            )
        if order == "random" and isinstance(configs, dict):
            raise ConfigError(
                "order='random' shuffles a list of configs; a dict space's configs are drawn by its search"
            )

    def spec(self, config: dict[str, Any]) -> LaunchSpec:
        """The launch of one config, checked as :func:`orch.launch` checks one."""
        spec = spec_of(
            "orch.sweep",
            RunOptions,
            self.options,
            fn=self.train,
            world_size=self.world_size,
            config=config,
            run_root=self.run_root_text,
        )
        if self.beat is not None:
            spec.heartbeat_interval = self.beat
        return spec
