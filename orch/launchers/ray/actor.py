"""What runs on each Ray node of a run: an actor that starts orch's host agent and holds it.

Ray imports this module on the nodes by name, so it imports nothing of orch's master or
launchers (the record's writer only, for the agent's log). The agent is a child of the
actor's process that dies with it (the kernel's ``PR_SET_PDEATHSIG``): when Ray ends the actor
(the run's end, ``close()``, or the launching process's death, which Ray's ownership turns
into the actor's), the agent ends, and its ranks, which watch the agent, end with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from orch.record.writes import own_dir

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the agent, before it runs: SIGKILL when the actor's process ends."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the actor ended before the line above: go with it
        os._exit(1)


class NodeAgent:
    """One node's host agent, started and held by a Ray actor (``ray.remote(NodeAgent)``)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, argv: list[str], env: dict[str, str], workdir: str, log_path: str) -> dict[str, Any]:
        """Start the agent; where it runs (the node's id and address, the pids)."""
        import ray  # on the node, inside the actor

        where = Path(log_path)
        with own_dir(where.parent) as folder:
            log = folder.append_fd(where.name)
        try:
            self.proc = subprocess.Popen(
                argv,
                env={**os.environ, **env},
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,  # it only asks the kernel for a signal: safe after fork
            )
        finally:
            os.close(log)
        context = ray.get_runtime_context()
        return {
            "node_id": context.get_node_id(),
            "address": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call,unused-ignore]
            "actor_pid": os.getpid(),
            "agent_pid": self.proc.pid,
        }

    def wait(self) -> int:
        """The agent's exit code, once it exited."""
        assert self.proc is not None
        return self.proc.wait()
