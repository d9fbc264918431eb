"""A run's master with its notebook panel open in the same process, as in a notebook that ran
``orch.launch``: the master's server on its background thread, and a real
:class:`orch.views.panel.Panel` (widgets, no kernel attached) polling it over gRPC every 0.5 s
and drawing its PNG, on the panel's own thread. For ``master_ingest.py``'s "4k+panel" case.

    python benchmarks/_panel_master.py WORLD RUN_ROOT LOG     # the token in ORCH_TOKEN

Prints ``serving on ADDRESS;`` (as ``orch master`` does) once it serves, then appends a line
``monotonic_seconds redraws polls`` to LOG every 0.25 s until it is killed.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from orch.launchers.run import serve
from orch.master.control.plan import RunPlan
from orch.master.coordinator import Coordinator
from orch.record.store import RunStore
from orch.views.panel import Panel
from orch.wire.client import MasterClient


class Source:
    """The panel's view of the run this process serves."""

    def __init__(self, address: str, token: str) -> None:
        self.address, self.token = address, token

    def connect(self) -> MasterClient:
        return MasterClient(self.address, token=self.token, timeout=60.0)

    def stop(self, reason: str = "") -> Any:
        raise NotImplementedError("the benchmark never stops its run from the panel")

    def log_files(self) -> dict[str, Path]:
        return {}

    def final_state(self) -> Any:
        return None


def main() -> None:
    world, root, log = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    token = os.environ["ORCH_TOKEN"]
    coord = Coordinator(RunPlan(world, heartbeat_timeout=600.0))
    store = RunStore(root / coord.run_id)
    server, _ = serve(
        coord,
        store,
        {"run_id": coord.run_id},
        host="127.0.0.1",
        port=0,
        token=token,
        tls_cert=None,
        tls_key=None,
    )
    print(f"orch master: run {coord.run_id} serving on {server.address}; with its panel", flush=True)
    panel = Panel(Source(server.address, token))  # type: ignore[arg-type]
    with log.open("a") as out:
        while True:
            out.write(f"{time.monotonic()} {panel.redraws} {panel.polls}\n")
            out.flush()
            time.sleep(0.25)


if __name__ == "__main__":
    main()
