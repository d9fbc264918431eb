"""A notebook output that is a live widget while its view runs, and a static record once it ended.

A saved notebook keeps each output's mime bundle, never the kernel's widgets: reopened
without the kernel that made it, an ipywidgets output is ``VBox(children=…)`` (GitHub,
nbconvert without widget state, an untrusted notebook) or "Error displaying widget: model
not found" (JupyterLab on a trusted notebook saved without widget state, which is how
JupyterLab saves by default). So a view that ends (a run that finished) replaces its own
output with a static record of its final state::

    class MyPanel:
        def __init__(self) -> None:
            self.widget = widgets.VBox([...])
            self.record = Record(self.widget, text="my panel (live)")

        def _ipython_display_(self) -> None:  # display(panel), or the last value of a cell
            self.record._ipython_display_()

        def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
            return self.record._repr_mimebundle_(**kwargs)

        def _ended(self) -> None:  # from any thread
            self.record.publish(png, f"<b>done</b>{IMAGE}<table>…</table>", "done: …")

:class:`Record` displays the widget with a ``display_id``; :meth:`Record.publish` sends an
``update_display_data`` for that id whose bundle is ``text/html`` (the HTML with the PNG
inlined as a ``data:`` URI), ``image/png`` and ``text/plain``, *without* the widget view
mimetype. Every output that showed the record (any cell) is replaced, in the live front end
and in what is saved. Why this way, as checked with JupyterLab 4.6 / jupyterlab_widgets 3,
nbclient 0.11, nbconvert 7.17 and ipykernel 7:

- Keeping the widget view mimetype in the final bundle is no fallback: JupyterLab's widget
  renderer has rank 0, is picked before any other mimetype, and shows "Error displaying
  widget: model not found" when the notebook has no saved widget state for the model;
  nbconvert picks the widget view whenever the state is saved (nbclient saves it), and
  then renders a script that needs the widget manager from a CDN, not the picture.
- JupyterLab (trusted or not) and nbconvert show one mimetype per output and prefer
  ``text/html`` to ``image/png``, so the HTML carries the picture itself; JupyterLab's
  sanitizer keeps ``data:`` images in untrusted HTML. ``image/png`` stays in the bundle
  for front ends that show images rather than HTML.
- A second output holding the record would leave the widget output next to it, with the
  same failure on reopening.
- The price: once the view has ended, the running kernel's output is the record too,
  not the widget (which stays reachable, e.g. ``display(panel.widget)``).

Threads: :meth:`publish` may run on any thread. JupyterLab routes an update to every
output with its display id whatever request it answers. nbclient (nbmake) keeps only
messages whose parent is the cell it is executing; ipykernel 7 gives a message sent from a
thread of the user's (which has no parent of its own) the parent of the request the
kernel handled last (a widget's event included): while a cell waits for a run
(``run.wait()``), that cell. A view that
ends while no cell runs is therefore published again from the cell that waits for it
(``run.wait()`` redraws the panel, which publishes), and :meth:`publish` may be called
more than once: each call sends the record again.
"""

from __future__ import annotations

import base64
import threading
import uuid
from typing import Any

from orch._text import escape_html

#: Where the picture goes in :meth:`Record.publish`'s ``html`` (without it, it goes first).
IMAGE = "<!-- orch:image -->"

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class Record:
    """One displayed view: ``live`` until :meth:`publish`, then its static record.

    ``live`` is anything with a ``_repr_mimebundle_`` (an ipywidgets widget); ``text`` is the
    ``text/plain`` of the live bundle (what a reader without widgets sees while the view is
    still live, instead of the widget's repr).
    """

    def __init__(self, live: Any, *, text: str = "") -> None:
        self.live = live
        self.text = text
        self.display_id = uuid.uuid4().hex
        self._static: dict[str, Any] | None = None
        self._shown = False
        # One lock for the bundle and the messages: a display and an update never cross.
        self._lock = threading.Lock()

    @property
    def published(self) -> bool:
        """True once the static record replaced the live view."""
        return self._static is not None

    def bundle(self) -> dict[str, Any]:
        """What a display of the record shows now: the live widget's bundle, or the record's."""
        if self._static is not None:
            return dict(self._static)
        data = dict(self.live._repr_mimebundle_())
        if self.text:
            data["text/plain"] = self.text
        return data

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None, **kwargs: Any) -> dict[str, Any]:
        return self.bundle()

    def _ipython_display_(self) -> None:
        """Show the record as an output that :meth:`publish` can update (IPython's display hook)."""
        from IPython.display import display

        with self._lock:
            display(self.bundle(), raw=True, display_id=self.display_id)  # type: ignore[no-untyped-call]
            self._shown = True

    def publish(self, png: bytes | None, html: str, text: str, *, alt: str = "") -> None:
        """Replace every output of this record with ``html`` (the PNG inlined at :data:`IMAGE`),
        ``png`` and ``text``; ``png`` None: a view with nothing to plot, the HTML and the text
        alone. Any thread; each call sends the record again."""
        static: dict[str, Any] = {}
        if png is None:
            page = html.replace(IMAGE, "", 1)
        else:
            b64 = static["image/png"] = base64.b64encode(png).decode("ascii")
            alt = escape_html(alt or (text.splitlines() or [""])[0])
            img = f'<img src="data:image/png;base64,{b64}" alt="{alt}" style="max-width:100%">'
            page = html.replace(IMAGE, img, 1) if IMAGE in html else img + html
        static = {"text/html": f'<div class="orch-record">{page}</div>', **static, "text/plain": text}
        with self._lock:
            self._static = static
            if self._shown:  # only ever true inside IPython
                from IPython.display import update_display

                update_display(dict(static), raw=True, display_id=self.display_id)  # type: ignore[no-untyped-call]
