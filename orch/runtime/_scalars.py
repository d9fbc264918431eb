"""Scalars written through ``torch.utils.tensorboard.SummaryWriter`` reach the rank's series.

Code that logs with ``writer.add_scalar("loss", value, step)`` (its own, or a library's: the
HF Trainer's TensorBoard callback, Lightning's TensorBoardLogger) shows in the panel with no
change: :func:`install` patches ``add_scalar`` and ``add_scalars`` the moment the user's code
imports ``torch.utils.tensorboard`` (an import hook, so a rank that never does pays nothing
and needs no tensorboard), and each call also records its value under its tag at its step.
The event files are written as before. ``add_scalars("loss", {"train": a, "val": b}, step)``
records ``loss/train`` and ``loss/val``; a call without a step takes the rank's last step.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from orch.runtime.current import record

WRITER = "torch.utils.tensorboard.writer"


def _step(global_step: Any) -> int | None:
    if global_step is None:
        return None
    try:
        return int(global_step)
    except (TypeError, ValueError):
        return None


def patch_writer(module: ModuleType) -> None:
    """Make ``module.SummaryWriter`` record its scalars in the rank's series too."""
    writer = getattr(module, "SummaryWriter", None)
    if writer is None or getattr(writer, "_orch_patched", False):
        return
    add_scalar, add_scalars = writer.add_scalar, writer.add_scalars

    @functools.wraps(add_scalar)
    def scalar(self: Any, tag: str, scalar_value: Any, global_step: Any = None, *args: Any, **kw: Any) -> Any:
        out = add_scalar(self, tag, scalar_value, global_step, *args, **kw)
        record(_step(global_step), {str(tag): scalar_value})
        return out

    @functools.wraps(add_scalars)
    def scalars(
        self: Any, main_tag: str, tag_scalar_dict: Any, global_step: Any = None, *a: Any, **kw: Any
    ) -> Any:
        out = add_scalars(self, main_tag, tag_scalar_dict, global_step, *a, **kw)
        if isinstance(tag_scalar_dict, dict):
            record(_step(global_step), {f"{main_tag}/{k}": v for k, v in tag_scalar_dict.items()})
        return out

    writer.add_scalar, writer.add_scalars = scalar, scalars
    writer._orch_patched = True


class _Loader(importlib.abc.Loader):
    """The module's own loader, then ``after(module)``."""

    def __init__(self, loader: importlib.abc.Loader, after: Callable[[ModuleType], None]) -> None:
        self.loader, self.after = loader, after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.after(module)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``after(module)`` once ``name`` is imported, whoever imports it."""

    def __init__(self, name: str, after: Callable[[ModuleType], None]) -> None:
        self.name, self.after = name, after

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, self.after)
                return spec
        return None


def install() -> None:
    """Patch SummaryWriter now if its module is imported already, else when it is."""
    loaded = sys.modules.get(WRITER)
    if loaded is not None:
        patch_writer(loaded)
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(WRITER, patch_writer))
