"""The views' poller threads are closed before the interpreter exits (orch.views._pollers)."""

from __future__ import annotations

import subprocess
import sys


def test_a_live_view_is_closed_when_the_interpreter_exits() -> None:
    code = (
        "import threading, time\n"
        "from orch.views._pollers import track\n"
        "class View:\n"
        "    def __init__(self):\n"
        "        self.stop = threading.Event()\n"
        "        self.thread = threading.Thread(target=self.stop.wait, daemon=True)\n"
        "        track(self)\n"
        "        self.thread.start()\n"
        "    def close(self):\n"
        "        self.stop.set(); self.thread.join(5.0)\n"
        "        print('closed, poller alive:', self.thread.is_alive(), flush=True)\n"
        "view = View()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "closed, poller alive: False"
