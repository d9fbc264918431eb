"""Find the training function a run names: ``package.module:function`` or ``path/train.py:main``.

An import path is looked up as ``python -m`` would: the launching folder first on
``sys.path``, so ``mytrain:main`` works from the folder that holds ``mytrain.py``. A file
path is loaded as a script is by torchrun, with its own folder on ``sys.path`` for its
sibling imports. The launcher resolves the name before any process starts (a typo is a
:class:`~orch.errors.ConfigError` at once); its workers resolve it again in the same folder.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orch.errors import ConfigError

TrainFn = Callable[[Any], Any]

EXAMPLE = "orch.example:train"


def split_target(fn: str) -> tuple[str, str]:
    """``"where:function"`` -> ``(where, function)``, or a ConfigError saying the expected form."""
    where, sep, attr = fn.rpartition(":")
    if not sep or not where or not attr or not all(part.isidentifier() for part in attr.split(".")):
        raise ConfigError(
            f"expected the training function as package.module:function or path/to/train.py:function, "
            f"got {fn!r}"
        )
    return where, attr


def is_file_target(where: str) -> bool:
    return where.endswith(".py") or "/" in where or "\\" in where


def resolve_fn(fn: TrainFn | str, workdir: str | Path | None = None) -> TrainFn:
    """The function ``fn`` names, looked up from ``workdir`` (default: the current folder)."""
    if callable(fn):
        return fn
    where, attr = split_target(fn)
    base = Path(workdir) if workdir is not None else Path.cwd()
    module = _load_file(base / where, fn) if is_file_target(where) else _import(where, base, fn)
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ConfigError(f"{where} has no attribute {attr!r} (from {fn!r})")
    if not callable(target):
        raise ConfigError(f"{fn} is a {type(target).__name__}, not a function")
    return target  # type: ignore[no-any-return]


def _import(module_name: str, base: Path, fn: str) -> Any:
    folder = str(base.resolve())
    if folder not in sys.path:
        sys.path.insert(0, folder)  # as `python -m` does
    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(
            f"cannot import {module_name!r} for {fn!r} (looked in {folder} and on sys.path): {e}"
        ) from e


def _load_file(path: Path, fn: str) -> Any:
    path = path.resolve()
    if not path.is_file():
        raise ConfigError(f"{fn!r}: there is no file {path}")
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # the script's folder, for its sibling imports
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{fn!r}: {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise ConfigError(f"{fn!r}: running {path} failed: {type(e).__name__}: {e}") from e
    return module


class Called:
    """A function written for ``accelerate.notebook_launcher(fn, args)`` as a run's function:
    each rank calls ``fn(*args)``; one whose first parameter is ``ctx`` gets the rank's context
    first, ``fn(ctx, *args)``. Code without ``ctx`` reaches it through ``orch.context()``."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], with_ctx: bool) -> None:
        self.__wrapped__ = fn
        self.args = args
        self.with_ctx = with_ctx
        for name in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(self, name, getattr(fn, name, None))

    def __call__(self, ctx: Any) -> Any:
        if self.with_ctx:
            return self.__wrapped__(ctx, *self.args)
        return self.__wrapped__(*self.args)


def called(fn: Any, args: tuple[Any, ...] | None) -> Any:
    """What a rank calls for ``orch.launch(fn, args=...)`` (see :class:`Called`): ``fn`` itself
    when it takes the rank's ``ctx`` alone, as ever. A function that cannot take what it would
    be given is a ConfigError now, before any process starts."""
    try:
        own = list(inspect.signature(fn, follow_wrapped=False).parameters)
        if own == ["ctx"] and args is None:  # fn(ctx), whatever it wraps (a gang's call does)
            return fn
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin, a C function: called as a function of ctx
        if args:
            raise ConfigError(f"cannot tell whether {fn!r:.60} takes args={args!r:.60}") from None
        return fn
    params = [
        p for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    with_ctx = bool(params) and params[0].name == "ctx"
    if args is None and not with_ctx:
        if _binds(signature, 0):
            return Called(fn, (), False)  # notebook_launcher's fn(): nothing to give it
        with_ctx = True  # a function of ctx by any name: fn(ctx)
    given = tuple(args or ())
    if not _binds(signature, len(given) + with_ctx):
        name = getattr(fn, "__qualname__", repr(fn))
        what = ", ".join((["ctx"] if with_ctx else []) + [f"{a!r:.30}" for a in given]) or "no arguments"
        raise ConfigError(
            f"the training function {name}{signature} cannot be called with ({what}): each rank calls "
            "fn(ctx) for a function whose first parameter is ctx (with args=(...) after it), else "
            "fn(*args) as accelerate.notebook_launcher does; pass args= to match its parameters"
        )
    if with_ctx and not given:
        return fn
    return Called(fn, given, with_ctx)


def _binds(signature: inspect.Signature, n: int) -> bool:
    try:
        signature.bind(*range(n))
    except TypeError:
        return False
    return True
