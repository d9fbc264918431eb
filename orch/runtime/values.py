"""What a rank's training function returns, kept for the process that launched the run.

A rank whose function returned something other than None writes it to its run dir as
``values/rank-<rank>.a<attempt>.pt`` (0600, through orch's writer), before it reports its end,
so that ``run.wait()`` finds it once the run ended (:mod:`orch.record.values` reads it back).
Tensors go to the CPU first, a module wrapped by DistributedDataParallel goes as the module it
wraps, and the file is written by ``torch.save`` with cloudpickle, so a module whose class was
defined in a notebook cell comes back as a module.

A value larger than the cap (``value_cap``, 1 GiB by default) is never written whole: its
tensors are counted first, before anything is pickled, and the write stops at the first
block past the cap (torch.save pickles the objects around the tensors in memory first, so a
huge value of plain Python objects is in the rank's memory once; its tensors never twice). A value that
cannot be pickled, or is too large, leaves ``values/rank-<rank>.a<attempt>.error`` instead,
which names the rank, the value's type and why; the kernel raises it when the value is asked
for. Either way the run's own outcome is the training's.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import cloudpickle

from orch.record.values import VALUE_CAP, VALUES_DIR, error_name, value_name, words
from orch.record.writes import own_dir, private_dir

log = logging.getLogger(__name__)


class _OverCap(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class _Capped:
    """A file that refuses to grow past ``cap`` bytes (torch.save writes through it)."""

    def __init__(self, f: Any, cap: int) -> None:
        self.f, self.cap, self.written, self.over = f, cap, 0, False

    def write(self, data: bytes) -> int:
        self.written += len(data)
        if self.written > self.cap:
            self.over = True
            raise _OverCap(self.written)
        return int(self.f.write(data))

    def flush(self) -> None:
        self.f.flush()


def on_cpu(value: Any) -> Any:
    """``value`` with its tensors on the CPU: in dicts, lists, tuples and modules (a module
    wrapped by DistributedDataParallel is the module it wraps)."""
    import torch  # here: a launcher imports this module, and only a rank pays for torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, torch.nn.parallel.DistributedDataParallel):
        return on_cpu(value.module)
    if isinstance(value, torch.nn.Module):
        return value.to("cpu")
    if type(value) in (dict, OrderedDict):
        return type(value)((k, on_cpu(v)) for k, v in value.items())
    if type(value) in (list, tuple):
        return type(value)(on_cpu(v) for v in value)
    return value


def tensor_bytes(value: Any, seen: set[int] | None = None) -> int:
    """The bytes of the tensors in ``value`` (each storage counted once)."""
    import torch

    seen = set() if seen is None else seen
    if isinstance(value, torch.Tensor):
        key = value.untyped_storage().data_ptr() if value.numel() else id(value)
        if key in seen:
            return 0
        seen.add(key)
        return int(value.numel() * value.element_size())
    if isinstance(value, torch.nn.Module):
        return sum(tensor_bytes(t, seen) for t in value.state_dict(keep_vars=True).values())
    if isinstance(value, Mapping):
        return sum(tensor_bytes(v, seen) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v, seen) for v in value)
    return 0


def keep_value(run_dir: Path, rank: int, attempt: int, value: Any, cap: int = VALUE_CAP) -> str | None:
    """Write what rank ``rank`` returned; None when it is kept (or was None), else why it is not
    (also left as the rank's error file and in its log)."""
    if value is None:
        return None
    import torch

    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    why = ""
    try:
        value = on_cpu(value)
        counted = tensor_bytes(value)
        if counted > cap:
            raise _OverCap(counted)
        private_dir(run_dir)
        with own_dir(run_dir / VALUES_DIR) as folder:
            capped: _Capped | None = None
            try:
                with folder.atomic(value_name(rank, attempt)) as f:
                    capped = _Capped(f, cap)
                    torch.save(value, capped, pickle_module=cloudpickle)  # type: ignore[arg-type]
            except RuntimeError as e:
                if capped is not None and capped.over:  # torch wraps the refusal in its own error
                    raise _OverCap(capped.written) from e
                raise
    except _OverCap as e:
        size = f"is {words(e.size)}, more than" if e.size == counted else "takes more than"
        why = (
            f"rank {rank}'s value ({kind}) {size} the cap of {words(cap)}: return less (a state_dict, "
            "the tensors you need), save it yourself (ctx.save_checkpoint), or raise the cap "
            "(orch.launch(value_cap=...))"
        )
    except Exception as e:
        why = (
            f"rank {rank}'s value ({kind}) cannot be sent back: {type(e).__name__}: {e}. Return what "
            "pickles (tensors, a state_dict, numbers, dicts of them), or save the rest yourself"
        )
    if not why:
        return None
    log.error("%s", why)
    try:
        private_dir(run_dir)
        with own_dir(run_dir / VALUES_DIR) as folder:
            folder.put(error_name(rank, attempt), why.encode())
    except OSError as e:
        log.error("rank %d: could not record why its value is missing: %s", rank, e)
    return why
