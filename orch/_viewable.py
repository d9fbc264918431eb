"""What every kind of run shares for notebooks: ``run.panel()`` and ``display(run)``.

Runs live below the views in orch's layers, so a run cannot import its panel. The face
(``orch/__init__``, imported before any of orch's modules) registers the one function that
finds the panel class for a kind of thing (``"run"``, ``"sweep"``); ipywidgets and
matplotlib load only when a panel is first wanted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

Kind = Literal["run", "sweep", "gang"]
_factory: Callable[[Kind], Any] | None = None


def set_panel_factory(factory: Callable[[Kind], Any]) -> None:
    """Register the function that returns the panel class for a kind (called by ``orch``)."""
    global _factory
    _factory = factory


def panel_class(kind: Kind) -> Any:
    """The panel class for ``kind``: ``Panel`` for a run, ``SweepPanel`` for a sweep."""
    if _factory is None:  # only when orch/__init__ was bypassed, which Python never does
        raise RuntimeError("orch's panels are not registered: import orch first")
    return _factory(kind)


class Viewable:
    """Mixin for a run or a sweep: one panel per run, shown by ``display()``."""

    _panel: Any = None

    def panel(self, **options: Any) -> Any:
        """The run's panel (one per run; passing options makes a new one)."""
        if self._panel is None or options:
            self._panel = panel_class("run")(self, **options)
        return self._panel

    def _ipython_display_(self) -> None:
        # Not the bundle alone: the panel's output carries a display id, for its final record.
        self.panel()._ipython_display_()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.panel()._repr_mimebundle_(**kwargs)
