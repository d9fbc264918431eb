"""The parts of the master are tested alone here: no sockets, no sleeps, no processes.

The suite's session fixture that starts multiprocessing's resource tracker and the workers'
forkserver is replaced by a no-op for these tests, so running only ``tests/control`` starts no
process (the check that no test leaves a process behind still applies).
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _resource_tracker() -> None:
    """No helper process: these tests start none."""
