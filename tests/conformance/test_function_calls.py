"""A function written for ``accelerate.notebook_launcher(fn, args, num_processes=N)`` runs
under ``orch.launch(fn, args=..., world_size=N)`` unchanged: each rank calls ``fn(*args)``
(``fn()`` with no args), and reaches the run through ``orch.context()`` and torchrun's
environment; ``fn(ctx)`` works as it always did, ``fn(ctx, *args)`` too. A function that
cannot take what it would be given is a ConfigError before any process starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import orch

pytestmark = pytest.mark.timeout(240)


def _no_parameters():  # type: ignore[no-untyped-def]
    """notebook_launcher's kind: no ctx; the group made, the rank from the environment."""
    t = torch.tensor([float(os.environ["RANK"]) + 1])
    dist.all_reduce(t)
    ctx = orch.context()
    assert ctx is not None
    return (int(os.environ["RANK"]), ctx.rank, t.item())


def _two_values(scale, offset):  # type: ignore[no-untyped-def]
    return scale * dist.get_rank() + offset


def _ctx_first(ctx, scale):  # type: ignore[no-untyped-def]
    return scale * ctx.rank


def _of_ctx(ctx):  # type: ignore[no-untyped-def]
    return ctx.world_size


def launched(fn, tmp_path: Path, **options):  # type: ignore[no-untyped-def]
    with orch.launch(fn, world_size=2, run_root=str(tmp_path), **options) as run:
        result = run.wait(timeout=180)
    assert result.state is orch.RunState.SUCCEEDED
    return result.values


def test_a_function_of_no_parameters_is_called_with_none(tmp_path: Path) -> None:
    assert launched(_no_parameters, tmp_path) == [(0, 0, 3.0), (1, 1, 3.0)]


def test_args_are_what_each_rank_calls_the_function_with(tmp_path: Path) -> None:
    assert launched(_two_values, tmp_path, args=(10, 1)) == [1, 11]
    assert launched(_ctx_first, tmp_path, args=[5]) == [0, 5]
    assert launched(_of_ctx, tmp_path) == [2, 2]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("fn", "args", "says"),
    [
        (_two_values, None, "_two_values(scale, offset) cannot be called with (ctx)"),
        (_two_values, (1,), "cannot be called with (1)"),
        (_no_parameters, (1, 2), "cannot be called with (1, 2)"),
        (_ctx_first, (1, 2), "cannot be called with (ctx, 1, 2)"),
    ],
)
def test_a_function_that_cannot_take_its_arguments_is_refused_before_any_process(
    tmp_path: Path,
    fn,
    args,
    says,  # type: ignore[no-untyped-def]
) -> None:
    with pytest.raises(orch.ConfigError, match=r"fn\(\*args\) as accelerate.notebook_launcher does") as e:
        orch.launch(fn, world_size=2, run_root=str(tmp_path), args=args)
    assert says in str(e.value)
    assert not any(tmp_path.iterdir())  # no run started
