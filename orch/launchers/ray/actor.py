"""What runs on each Ray node of a run: an actor that starts orch's host agent and holds it
(or, for a gang, the node's gang ranks).

Ray imports this module on the nodes by name, so it imports nothing of orch's master or
launchers (the record's writer only, for the agent's log, and the gang rank's variable).
The agent is a child of the actor's process that dies with it (the kernel's
``PR_SET_PDEATHSIG``): when Ray ends the actor (the run's end, ``close()``, or the launching
process's death, which Ray's ownership turns into the actor's), the agent ends, and its
ranks, which watch the agent, end with it. A gang's ranks die with the actor the same way.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from orch.record.writes import own_dir
from orch.runtime.launcher_env import GANG_RANK_ENV

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the agent, before it runs: SIGKILL when the actor's process ends."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the actor ended before the line above: go with it
        os._exit(1)


class NodeAgent:
    """One node's processes, started and held by a Ray actor (``ray.remote(NodeAgent)``): orch's
    host agent for a run, or a gang's ranks on the node, one process each."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self,
        argv: list[str],
        env: dict[str, str],
        workdir: str,
        log_path: str,
        ranks: list[int] | None = None,
    ) -> dict[str, Any]:
        """Start ``argv`` once, or once per rank of ``ranks`` (each with its rank in
        ``ORCH_GANG_RANK``); where they run (the node's id and address, the pids)."""
        import ray  # on the node, inside the actor

        where = Path(log_path)
        with own_dir(where.parent) as folder:
            log = folder.append_fd(where.name)
        try:
            for rank in ranks if ranks is not None else [None]:
                extra = {} if rank is None else {GANG_RANK_ENV: str(rank)}
                self.procs.append(
                    subprocess.Popen(
                        argv,
                        env={**os.environ, **env, **extra},
                        cwd=workdir,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        preexec_fn=_die_with_parent,  # it only asks the kernel for a signal: safe after fork
                    )
                )
        finally:
            os.close(log)
        context = ray.get_runtime_context()
        return {
            "node_id": context.get_node_id(),
            "address": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call,unused-ignore]
            "hostname": socket.gethostname(),  # with the agent's pid, its name to the master
            "actor_pid": os.getpid(),
            "agent_pid": self.procs[0].pid,
            "pids": [p.pid for p in self.procs],
        }

    def wait(self) -> int:
        """Once a process failed, its exit code; once every one exited, 0."""
        while True:
            codes = [p.poll() for p in self.procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                return failed[0]
            if all(c is not None for c in codes):
                return 0
            time.sleep(0.2)
