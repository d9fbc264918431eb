"""A torchrun script or module as a run's target: each rank runs it as ``__main__``.

``orch run --workers 2 train.py --epochs 2``, ``orch run -m pkg.train ...`` and
``orch.launch("train.py", args=[...])`` (or ``module="pkg.train"``) run code written for
``torchrun`` unchanged: in every rank the script runs as torchrun runs it, with its own
``sys.argv``, its folder first on ``sys.path``, and torchrun's environment
(:mod:`orch.runtime._torchrun`), so its argparse, its ``init_process_group`` and its
``destroy_process_group`` work. Its exit decides the rank's outcome as a process's would:
returning, ``sys.exit(0)`` or ``os._exit(0)`` is success, any other exit code or exception a
failure (``os._exit`` reports first: ``orch.runtime.worker._exit_reporting``).

A run's config (a sweep's trial) reaches the script as arguments, ``--key=value`` after the
script's own (as sweep agents pass them), and as JSON in ``$ORCH_CONFIG``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orch.errors import ConfigError
from orch.runtime.target import called

CONFIG_ENV = "ORCH_CONFIG"


@dataclass(frozen=True)
class Script:
    """A script file (``path``, absolute) or a module (``module``), with its arguments."""

    path: str | None = None
    module: str | None = None
    args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.path is None) == (self.module is None):
            raise ConfigError("a script target is a file path or a module name, exactly one of them")
        if not all(isinstance(a, str) for a in self.args):
            raise ConfigError(f"a script's args must be strings, got {list(self.args)!r:.120}")

    def describe(self) -> str:
        """``train.py --epochs 2`` or ``-m pkg.train --epochs 2``: as the command line reads."""
        head = f"-m {self.module}" if self.module is not None else os.path.basename(self.path or "")
        return " ".join([head, *self.args])

    @property
    def stem(self) -> str:
        """``train`` for ``path/train.py``, ``train`` for ``-m pkg.train``: a sweep's default name."""
        if self.module is not None:
            return self.module.rsplit(".", 1)[-1]
        return Path(self.path or "script").stem

    def code(self) -> str:
        """The script's source, for a sweep's reuse of finished configs (a changed script
        runs them again); its path where it cannot be read."""
        where = self.path if self.path is not None else _module_file(self.module or "")
        try:
            text = Path(where or "").read_text()
        except (OSError, UnicodeDecodeError):
            text = where or ""
        return hashlib.sha256(text.encode()).hexdigest()

    def argv(self, config: dict[str, Any]) -> list[str]:
        """The arguments after the program: the script's own, then the config's."""
        return [*self.args, *config_args(config)]

    def __call__(self, ctx: Any) -> None:
        """Run the script as ``__main__`` in this rank (what the worker calls as its function)."""
        config = dict(getattr(ctx, "config", {}) or {})
        os.environ[CONFIG_ENV] = json.dumps(config)
        args = self.argv(config)
        saved_argv, saved_path = sys.argv[:], sys.path[:]
        try:
            if self.path is not None:
                sys.argv = [self.path, *args]
                sys.path.insert(0, os.path.dirname(self.path))  # as `python train.py` does
                runpy.run_path(self.path, run_name="__main__")
            else:
                sys.argv = [self.module or "", *args]  # run_module puts the file name first
                if os.getcwd() not in sys.path:
                    sys.path.insert(0, os.getcwd())  # as `python -m` does
                runpy.run_module(self.module or "", run_name="__main__", alter_sys=True)
        finally:
            sys.argv, sys.path[:] = saved_argv, saved_path


def config_args(config: dict[str, Any]) -> list[str]:
    """``{"lr": 0.1, "layers": [2, 3]}`` -> ``["--lr=0.1", "--layers=[2, 3]"]``: numbers and
    strings as written, booleans as ``true``/``false``, lists and dicts as JSON."""
    out = []
    for key, value in config.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float, str)):
            text = str(value)
        else:
            text = json.dumps(value)
        out.append(f"--{key}={text}")
    return out


def script_target(
    fn: Any, *, args: list[str] | tuple[str, ...] | None, module: str | None, workdir: str
) -> Any:
    """What ``launch(train, args=..., module=...)`` runs: a :class:`Script` when ``train`` is a
    script's path (``"train.py"``, no ``:function``) or ``module`` is given, else ``train``
    itself. A script that is not there is a ConfigError now, before any process starts."""
    if args is not None and (isinstance(args, str) or not isinstance(args, (list, tuple))):
        raise ConfigError(
            "args must be a list: a script's arguments (strings), or the values a function is "
            f"called with, got {args!r:.80}"
        )
    argv = tuple(args or ())
    if module is not None:
        if fn is not None:
            raise ConfigError(
                f"module={module!r} runs a module as a script: leave out the training function ({fn!r:.60})"
            )
        if not isinstance(module, str) or not all(p.isidentifier() for p in module.split(".")):
            raise ConfigError(f"module must be a dotted module name such as 'pkg.train', got {module!r}")
        if _module_file(module, workdir) is None:
            raise ConfigError(
                f"there is no module {module!r} to run (looked in {workdir} and on sys.path), as "
                "`python -m` would not find it either"
            )
        return Script(module=module, args=argv)
    if is_script_path(fn):
        path = (Path(workdir) / fn).resolve()
        if not path.is_file():
            raise ConfigError(f"there is no script {path} to run (from {fn!r})")
        return Script(path=str(path), args=argv)
    if callable(fn):
        return called(fn, None if args is None else argv)
    if argv:
        raise ConfigError(
            "args= are a script's command-line arguments or a function's values: pass a script "
            '("train.py"), module= or the function itself, or give a function named by its import '
            "path its settings through config="
        )
    return fn


def is_script_path(fn: Any) -> bool:
    """``"train.py"`` or ``"path/to/train.py"``: a script, not ``"train.py:main"``."""
    return isinstance(fn, str) and fn.endswith(".py") and ":" not in fn


def _module_file(module: str, workdir: str | None = None) -> str | None:
    """The file ``python -m module`` would run, found without running it (its parent
    packages are imported, as python -m imports them)."""
    added = workdir is not None and workdir not in sys.path
    if added:
        sys.path.insert(0, workdir or "")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    finally:
        if added:
            sys.path.remove(workdir or "")
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package: python -m runs its __main__
        main = importlib.util.find_spec(f"{module}.__main__")
        return main.origin if main is not None else None
    return spec.origin
