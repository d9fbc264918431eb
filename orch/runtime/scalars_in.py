"""What ``ctx.log`` and ``ctx.save_checkpoint`` take as a value: a real number, in any of the
forms training code holds one (a float, an int, a numpy scalar, a one-element tensor), and
the words that name what else was passed."""

from __future__ import annotations

import numbers
import operator
from typing import Any

import numpy as np
import torch


def as_value(value: Any) -> float:
    """A checkpoint's value as a float: a real number or a one-element tensor."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if one_real(value):
        return float(value.item())
    raise TypeError(
        f"ctx.save_checkpoint: value={short(value)} is {kind(value)}, not a real number: pass the "
        "metric the checkpoint is ranked by as a float (or a one-element tensor)"
    )


def as_step(step: Any) -> int:
    if not isinstance(step, bool):
        try:
            return operator.index(step)  # numpy integers, integer tensors with one element
        except TypeError:
            pass
    raise TypeError(
        f"ctx.log: step must be an integer (count optimizer steps, e.g. epoch * len(loader) + i), "
        f"got {type(step).__name__} {step!r}"
    )


def as_reals(scalars: dict[str, Any]) -> dict[str, Any]:
    """``scalars`` with every value a float or int, ``None`` dropped; TypeError names a bad key."""
    out: dict[str, Any] = {}
    for key, value in scalars.items():
        if value is None:
            continue
        t = type(value)
        if t is float or t is int:
            out[key] = value
        elif t is bool or t is np.bool_ or isinstance(value, numbers.Real):  # numpy scalars are Real
            out[key] = float(value)
        elif one_real(value):
            out[key] = float(value.item())
        else:
            raise TypeError(
                f"ctx.log: {key}={short(value)} is {kind(value)}, not a real number: log floats, ints, "
                "numpy scalars or one-element tensors (use .item() on a loss tensor's value)"
            )
    return out


def one_real(value: Any) -> bool:
    """A tensor or numpy array holding exactly one real (or bool) value."""
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.is_complex()
    if isinstance(value, np.ndarray):
        return (
            value.size == 1
            and (np.issubdtype(value.dtype, np.number) or value.dtype == np.bool_)
            and (not np.iscomplexobj(value))
        )
    return False


def kind(value: Any) -> str:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        shape = tuple(value.shape)
        return f"a {type(value).__name__} of shape {shape} and dtype {value.dtype}"
    return f"a {type(value).__name__}"


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
