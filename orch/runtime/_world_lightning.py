"""The Lightning Trainers and Fabrics a rank has made, for :mod:`orch.runtime._world`.

Accelerate keeps its world in module state; Lightning keeps it on each ``Trainer`` (or
``Fabric``), which nothing holds but the user's code. So once the rank has imported the module
that defines the class (looked up in ``sys.modules``; nothing is imported here), its
``__init__`` is wrapped, once, to keep a weak reference to each instance it finishes, and the
instances made before the wrap are found once through the garbage collector (an instance refers
to its class). The wrap also notes each one's world size as it is made, for an instance gone
before the next beat. After that a beat costs a few dict lookups and a ``world_size`` read per
live instance::

    beat ──▶ module in sys.modules? ──no──▶ nothing
                    │ yes, first time
                    ▼
             wrap Class.__init__ ──▶ gc.get_referrers(Class and its subclasses)
                    │                      │
                    ▼                      ▼
             made: id ──▶ weakref (gone with the instance) ──▶ world_size of each
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
import weakref
from typing import Any

_MARK = "_orch_records_instances"


class Made:
    """The live instances of the class ``name`` in any of ``modules`` (and of its subclasses)."""

    def __init__(self, name: str, modules: tuple[str, ...]) -> None:
        self.name = name
        self.modules = modules
        self.made: dict[int, weakref.ref[Any]] = {}
        self.born: list[Any] = []  # world sizes as instances were made: one may be gone by the beat
        self._wrapped: set[str] = set()

    def add(self, obj: Any) -> None:
        key = id(obj)
        if key not in self.made:

            def gone(_: weakref.ref[Any]) -> None:  # as the instance goes, before its id is another's
                self.made.pop(key, None)

            self.made[key] = weakref.ref(obj, gone)

    def world_sizes(self) -> list[int]:
        """The world sizes of the instances made since the last look and of each live one; wraps
        the class the first look its module is here."""
        for module in self.modules:
            if module not in self._wrapped and module in sys.modules:
                # a module is in sys.modules while it is still being imported: wait for its class
                cls = getattr(sys.modules[module], self.name, None)
                if isinstance(cls, type):
                    self._wrapped.add(module)  # tried once, whatever happens
                    self._wrap(cls)
        sizes: list[Any] = []
        while self.born:  # pop: the training thread may append meanwhile
            sizes.append(self.born.pop())
        for ref in tuple(self.made.values()):  # the training thread may add one meanwhile
            obj = ref()
            try:
                sizes.append(obj.world_size if obj is not None else None)
            except Exception:  # one half-made, or torn down
                continue
        return [n for n in sizes if isinstance(n, int)]

    def _wrap(self, cls: type) -> None:
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, _MARK, False):
            return
        add, born = self.add, self.born

        @functools.wraps(init)  # inspect.signature (LightningCLI) still sees the original's
        def __init__(obj: Any, *args: Any, **kwargs: Any) -> None:
            init(obj, *args, **kwargs)
            with contextlib.suppress(Exception):  # never into the user's code
                add(obj)
                born.append(obj.world_size)

        setattr(__init__, _MARK, True)
        cls.__init__ = __init__  # type: ignore[misc]
        # those made before the wrap, found once (an instance refers to its type)
        classes, todo = set(), [cls]
        while todo:
            c = todo.pop()
            if c not in classes:
                classes.add(c)
                todo.extend(c.__subclasses__())
        for obj in gc.get_referrers(*classes):
            if type(obj) in classes:  # exact types: no __class__ of a stranger is run
                add(obj)


TRAINERS = Made("Trainer", ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer"))
FABRICS = Made("Fabric", ("lightning.fabric.fabric", "lightning_fabric.fabric"))
