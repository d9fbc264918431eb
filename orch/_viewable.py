"""What every kind of run shares for notebooks: ``run.panel()`` and ``display(run)``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from .panel import Panel, PanelSource


class Viewable:
    """Mixin for a :class:`~orch.panel.PanelSource`: one panel per run, shown by ``display()``."""

    _panel: Panel | None = None

    def panel(self, **options: Any) -> Panel:
        """The run's panel (one per run; passing options makes a new one)."""
        from .panel import Panel  # ipywidgets and matplotlib: only when a panel is wanted

        if self._panel is None or options:
            self._panel = Panel(cast("PanelSource", self), **options)
        return self._panel

    def _ipython_display_(self) -> None:
        # Not the bundle alone: the panel's output carries a display id, for its final record.
        self.panel()._ipython_display_()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.panel()._repr_mimebundle_(**kwargs)
