"""A real Ray cluster, brought up by the tests themselves: a head and a second node, on loopback.

``ray start --head --node-ip-address=127.0.0.1`` and then ``ray start --address=HEAD`` for the
second node, each with 2 CPUs, as Ray's own docs test several nodes on one machine (chosen over
``ray.cluster_utils.Cluster``, which runs the nodes from the test's own process: here the
cluster's processes are the cluster's, and the run's launcher is a process of its own, as a
notebook kernel is). Every Ray process of the cluster carries its own temporary folder on its
command line, and at teardown each is ended by its pid (never ``ray stop``, which would end
any other Ray on the machine). The daemons are started without the test's ``ORCH_TEST_TAG``,
so tests/conftest.py does not count them as a test's leftovers.

Needs ``ray`` (the dev extra); without it the tests that use the cluster are skipped, saying
why, and under CI (``CI`` set: the dev extra installs it) they fail instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).parent / "ray")


@dataclass
class RayCluster:
    address: str  # the head's GCS, HOST:PORT
    root: Path  # its temporary folder, on every one of its processes' command lines
    env: dict[str, str]  # what the cluster's commands and drivers run with

    def processes(self) -> list[psutil.Process]:
        """Every process of this cluster still alive."""
        mine = []
        for p in psutil.process_iter(["pid", "cmdline", "environ"]):
            with contextlib.suppress(psutil.Error):
                line = " ".join(p.info["cmdline"] or [])
                if str(self.root) in line or (p.info["environ"] or {}).get("ORCH_RAY_CLUSTER") == str(
                    self.root
                ):
                    mine.append(p)
        return mine

    def ask(self, code: str) -> str:
        """The last line a separate driver of the cluster prints, running ``code`` (``ray`` imported)."""
        head = "import json, ray\n"
        head += f"ray.init(address={self.address!r}, log_to_driver=False, logging_level='ERROR')\n"
        done = subprocess.run(
            [sys.executable, "-c", head + code], env=self.env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip().splitlines()[-1]

    def placement_groups(self) -> list[str]:
        """The states of the cluster's placement groups."""
        code = "from ray.util import placement_group_table\n"
        code += "print(json.dumps([v['state'] for v in placement_group_table().values()]))\n"
        states: list[str] = json.loads(self.ask(code))
        return states

    def second_raylet(self) -> psutil.Process:
        """The raylet of the node that joined last (the head's socket is ``raylet``, each node
        that joined after it ``raylet.N``)."""
        found = [
            p
            for p in self.processes()
            if p.name() == "raylet"
            and not any(a.startswith("--raylet_socket_name=") and a.endswith("/raylet") for a in p.cmdline())
        ]
        assert found, [" ".join(p.cmdline())[:200] for p in self.processes()]
        return max(found, key=lambda p: p.create_time())

    def add_node(self, cpus: int = 2) -> None:
        """One more node (after one was lost), waited for until the cluster has two live nodes."""
        second = [RAY, "start", f"--address={self.address}", f"--temp-dir={self.root}"]
        common = ["--node-ip-address=127.0.0.1", f"--num-cpus={cpus}", "--disable-usage-stats"]
        subprocess.run([*second, *common], env=self.env, check=True, capture_output=True, timeout=180)
        _wait_nodes(self, 2)

    def actors_alive(self) -> int:
        # The GCS's own actor table (Ray's state API needs the dashboard; this cluster runs none).
        code = "from ray._private.state import actors\n"
        code += "print(sum(1 for a in actors().values() if a['State'] != 'DEAD'))\n"
        return int(self.ask(code))


def available() -> str | None:
    """Why a Ray cluster cannot be brought up here (None: it can)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install -e '.[dev]')"
    if not Path(RAY).exists():
        return f"{RAY} is missing"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def start_cluster(cpus_per_node: int = 2) -> Iterator[RayCluster]:
    root = Path(tempfile.mkdtemp(prefix="orch-ray-", dir="/tmp"))  # Ray's socket paths must stay short
    env = {k: v for k, v in os.environ.items() if k != "ORCH_TEST_TAG"}
    env.update({"RAY_USAGE_STATS_ENABLED": "0", "ORCH_RAY_CLUSTER": str(root)})
    port = _free_port()
    cluster = RayCluster(address=f"127.0.0.1:{port}", root=root, env=env)
    common = ["--node-ip-address=127.0.0.1", f"--num-cpus={cpus_per_node}", "--disable-usage-stats"]
    try:
        head = [RAY, "start", "--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={root}"]
        subprocess.run([*head, *common], env=env, check=True, capture_output=True, timeout=180)
        second = [RAY, "start", f"--address={cluster.address}", f"--temp-dir={root}"]
        subprocess.run([*second, *common], env=env, check=True, capture_output=True, timeout=180)
        _wait_nodes(cluster, 2)
        yield cluster
    finally:
        for p in cluster.processes():
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 20
        while cluster.processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        shutil.rmtree(root, ignore_errors=True)


def _wait_nodes(cluster: RayCluster, count: int, timeout: float = 60.0) -> None:
    code = (
        "import ray, time\n"
        f"ray.init(address={cluster.address!r}, log_to_driver=False, logging_level='ERROR')\n"
        f"deadline = time.time() + {timeout}\n"
        f"while sum(1 for n in ray.nodes() if n['Alive']) < {count}:\n"
        "    assert time.time() < deadline, ray.nodes()\n"
        "    time.sleep(0.2)\n"
    )
    subprocess.run(
        [sys.executable, "-c", code], env=cluster.env, check=True, capture_output=True, timeout=timeout + 60
    )
