"""What a rank's heartbeat sees of a library's world (orch.runtime._world), in one process: a
stand-in for Lightning's trainer module, so that the instances' bookkeeping is seen alone (the
real Trainer under orch.launch is tests/integrations/test_lightning.py)."""

from __future__ import annotations

import gc
import sys
import types
from typing import Any

import pytest

from orch.runtime import _world
from orch.runtime._world_lightning import Made

MODULE = "fake_lightning.trainer"


class Ctx:
    world_size = 2

    def __init__(self) -> None:
        self.warned: list[str] = []

    def warn(self, text: str) -> None:
        self.warned.append(text)


def fake_module(monkeypatch: pytest.MonkeyPatch) -> Any:
    class Trainer:
        def __init__(self, devices: int = 1) -> None:
            """The original's doc."""
            self.world_size = devices

    mod = types.ModuleType(MODULE)
    mod.Trainer = Trainer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, MODULE, mod)
    return Trainer


def test_nothing_is_looked_at_before_the_module_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    made = Made("Trainer", (MODULE,))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    assert made.world_sizes() == []
    assert MODULE not in sys.modules  # not imported by the look


def test_instances_before_and_after_the_wrap_are_seen_while_they_live(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = Made("Trainer", (MODULE,))
    assert made.world_sizes() == []
    trainer = fake_module(monkeypatch)

    class Sub(trainer):  # type: ignore[misc, valid-type]
        pass

    early, sub = trainer(1), Sub(3)
    assert sorted(made.world_sizes()) == [1, 3]  # found through the garbage collector
    late = trainer(devices=2)
    assert sorted(made.world_sizes()) == [1, 2, 2, 3]  # the new one as it was made, and live
    assert sorted(made.world_sizes()) == [1, 2, 3]  # recorded by the wrapped __init__
    assert trainer.__init__.__doc__ == "The original's doc."  # functools.wraps
    del early, sub
    gc.collect()
    assert made.world_sizes() == [2] and len(made.made) == 1
    assert late.world_size == 2


def test_a_failing_init_raises_as_before_and_a_failing_read_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = Made("Trainer", (MODULE,))
    trainer = fake_module(monkeypatch)
    made.world_sizes()
    with pytest.raises(TypeError):
        trainer(devices=1, bogus=True)
    ok, broken = trainer(2), trainer(2)
    del broken.world_size
    assert made.world_sizes() == [2, 2, 2]  # as they were made, and the one that still reads
    assert made.world_sizes() == [2]
    assert ok.world_size == 2


def test_an_instance_gone_before_the_look_is_still_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    made = Made("Trainer", (MODULE,))
    trainer = fake_module(monkeypatch)
    made.world_sizes()
    trainer(3)  # made and gone between two looks: its size was noted as it was made
    assert made.world_sizes() == [3]
    assert made.world_sizes() == []


def test_the_watcher_warns_once_for_each_count_with_the_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    counts: dict[str, list[int]] = {"Lightning": [1], "Lightning Fabric": []}
    seen = {name: (lambda name=name: counts[name]) for name in counts}
    monkeypatch.setattr(_world, "SEEN", {**seen, "Broken": lambda: 1 / 0})
    ctx = Ctx()
    look = _world.watcher(ctx)
    look(), look()
    counts["Lightning"].append(2)  # the run's own: nothing to say
    look()
    assert len(ctx.warned) == 1, ctx.warned
    assert ctx.warned[0].startswith("Lightning sees 1 process, but this run has 2 ranks: pass Trainer(")
    assert 'devices=int(os.environ["LOCAL_WORLD_SIZE"])' in ctx.warned[0]
    counts["Lightning"].append(4)
    counts["Lightning Fabric"].append(1)
    look(), look()  # found at one beat, said in one warning (a beat carries one)
    assert len(ctx.warned) == 2, ctx.warned
    assert ctx.warned[1].startswith("Lightning sees 4 processes, but this run has 2 ranks")
    assert "; Lightning Fabric sees 1 process, but this run has 2 ranks: pass Fabric(" in ctx.warned[1]
