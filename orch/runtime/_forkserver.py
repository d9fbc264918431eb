"""Imported last in the workers' forkserver (a preload module): make its exit immediate.

The forkserver has torch imported; a normal interpreter shutdown then takes about a second
(longer on a loaded machine), and the forkserver outlives its launcher by that much. It
holds nothing to flush or clean up, so the last atexit hook registered (the first to run)
ends it at once. Its children never run atexit hooks: they leave through ``os._exit``.
"""

from __future__ import annotations

import atexit
import os

atexit.register(os._exit, 0)
