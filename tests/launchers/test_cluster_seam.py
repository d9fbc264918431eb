"""The cluster seam: every cluster kind keeps one contract, found in one place
(:mod:`orch.launchers.clusters`), and a kind from another package, found through its
``orch.clusters`` entry point, runs a real run without orch naming it anywhere."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import orch
from conftest import TESTS
from orch.launchers.clusters import Cluster, ClusterKind, kind_of, kinds
from orch.launchers.launcher import Launcher
from orch.launchers.local.launcher import LocalLauncher

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("kind", kinds(), ids=lambda k: k.name)
def test_every_cluster_kind_keeps_the_contract(kind: ClusterKind) -> None:
    launcher = kind.launcher()
    assert issubclass(launcher, Launcher) and not inspect.isabstract(launcher), launcher
    options = kind.options()  # a kind's options have defaults for a first try
    assert isinstance(options, Cluster) and options.world_size >= 1 and options.describe()
    assert kind_of(options) is kind
    assert callable(kind.master_host) and callable(kind.check)
    assert (kind.gang_job is None) == (kind.place_rank is None), (
        "a gang needs both its job and its ranks' place"
    )


def test_this_machine_s_launcher_keeps_the_contract_too() -> None:
    assert issubclass(LocalLauncher, Launcher) and not inspect.isabstract(LocalLauncher)


def test_slurm_is_a_kind_found_by_the_seam() -> None:
    assert "slurm" in [k.name for k in kinds()]
    assert kind_of(orch.Slurm(nodes=2, tasks_per_node=2)).name == "slurm"


def test_a_cluster_of_no_kind_is_refused_naming_the_kinds_there_are(tmp_path: Path) -> None:
    with pytest.raises(orch.ConfigError) as refused:
        orch.launch("jobs:allreduce_steps", world_size=2, cluster=object(), run_root=str(tmp_path))  # type: ignore[arg-type]
    assert "Slurm(...) for slurm" in str(refused.value) and "object" in str(refused.value), refused.value


TINY = '''
"""A cluster kind from outside orch: its "nodes" are this machine."""
from dataclasses import dataclass

from orch.launchers.clusters import ClusterKind


@dataclass(frozen=True)
class Tiny:
    nodes: int = 1
    ranks_per_node: int = 1

    @property
    def world_size(self):
        return self.nodes * self.ranks_per_node

    def describe(self):
        return f"{self.nodes} tiny node(s) of {self.ranks_per_node} ranks"


def _launcher():
    from orch.launchers.local.launcher import LocalLauncher

    class TinyLauncher(LocalLauncher):
        def submit(self, parts):
            parts.meta["cluster"] = "tiny: " + self.spec.cluster.describe()
            parts.store.write_meta(parts.meta)

    return TinyLauncher


KIND = ClusterKind(name="tiny", options=Tiny, launcher=_launcher, master_host=lambda cluster: "127.0.0.1")
'''
DRIVER = """
import json, sys
sys.path.insert(0, {tests!r})
import orch, tinykind
from orch.launchers.clusters import kinds
run = orch.launch("jobs:allreduce_steps", world_size=2, cluster=tinykind.Tiny(2, 1), run_root={root!r})
result = run.wait(timeout=120)
meta = json.loads((run.run_dir / "run.json").read_text())
run.close()
print(json.dumps({{"kinds": [k.name for k in kinds()], "state": result.state.value,
                   "cluster": meta.get("cluster"), "launcher": type(run.launcher).__name__}}))
"""


def test_a_kind_from_another_package_is_found_through_its_entry_point_and_runs_a_run(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    site = tmp_path / "site"
    (site / "tinykind-0.1.dist-info").mkdir(parents=True)
    (site / "tinykind.py").write_text(textwrap.dedent(TINY))
    (site / "tinykind-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tinykind\nVersion: 0.1\n"
    )
    (site / "tinykind-0.1.dist-info" / "entry_points.txt").write_text(
        "[orch.clusters]\ntiny = tinykind:KIND\n"
    )
    env = {**subprocess_env, "PYTHONPATH": str(site)}
    code = DRIVER.format(tests=str(TESTS), root=str(tmp_path / "runs"))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["kinds"][:1] == ["slurm"] and "tiny" in out["kinds"], out
    assert out["state"] == "SUCCEEDED", out
    assert out["launcher"] == "TinyLauncher" and out["cluster"] == "tiny: 2 tiny node(s) of 1 ranks", out


NO_GANGS = """
import json
from dataclasses import dataclass
import orch
from orch.launchers.clusters import ClusterKind, register
from orch.launchers.local.launcher import LocalLauncher

@dataclass(frozen=True)
class NoGangs:
    nodes: int = 2

    @property
    def world_size(self):
        return self.nodes

    def describe(self):
        return f"{{self.nodes}} node(s)"

register(ClusterKind("nogangs", NoGangs, launcher=lambda: LocalLauncher, master_host=lambda c: "127.0.0.1"))
try:
    orch.gang(2, cluster=NoGangs(), run_root={root!r})
    said = "started"
except orch.OrchError as e:
    said = str(e)
print(json.dumps(said))
"""


def test_a_gang_on_a_kind_that_offers_none_is_refused_before_anything_starts(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """A kind registered with no gang_job (its own process: the registry is the process's)."""
    code = NO_GANGS.format(root=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", code], env=subprocess_env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == "the nogangs cluster kind offers no gangs: use orch.launch on it", said
