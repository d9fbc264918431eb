"""The package's public surface and its two install routes stay in step."""

from __future__ import annotations

import re
import subprocess
import sys

import tomllib
import yaml

import orch
from conftest import ROOT

CONDA_NAMES = {"torch": "pytorch"}


def _split(requirement: str) -> tuple[str, str]:
    m = re.match(r"^([A-Za-z0-9_.\-]+)\s*(.*)$", requirement.strip())
    assert m, requirement
    return m.group(1).lower(), m.group(2).replace(" ", "")


def test_environment_yml_installs_what_pyproject_requires() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = dict(_split(d) for d in env["dependencies"] if isinstance(d, str))
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    for requirement in project["dependencies"]:
        name, bound = _split(requirement)
        conda_name = CONDA_NAMES.get(name, name)
        assert conda.get(conda_name) == bound, f"environment.yml: {conda_name}{bound} expected"
    python_bound = project["requires-python"]
    assert conda["python"] == python_bound
    assert any(".[dev]" in entry for entry in pip), "environment.yml must install orch[dev] with pip"


def test_public_names_are_sorted_exported_and_documented() -> None:
    assert orch.__all__ == sorted(orch.__all__)
    for name in orch.__all__:
        assert hasattr(orch, name), name
    readme = (ROOT / "README.md").read_text()
    documented = set(re.findall(r"`orch\.([A-Za-z_]\w*)(?![\w.])", readme))
    assert documented <= set(orch.__all__), (
        f"README documents names orch does not export: {documented - set(orch.__all__)}"
    )
    for name in ("launch", "Run", "RunFailed", "RunState"):
        assert name in documented, f"README does not document orch.{name}"


def test_readme_top_shows_exactly_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```(?:bash|sh)?\n(.*?)```", readme, re.S)
    assert first_block
    commands = [ln.split("#")[0].strip() for ln in first_block.group(1).splitlines()]
    assert [c for c in commands if c] == ["scripts/run.sh", "scripts/test.sh"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "exec scripts/test.sh" in ci


def test_the_cli_and_attach_never_import_torch() -> None:
    # `orch status` and orch.attach read a master over gRPC: torch would cost them ~1.5 s.
    code = (
        "import sys, orch, orch.cli, orch.api\n"
        "orch.cli.build_parser().parse_args(['status', '--master', '127.0.0.1:1'])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "orch.Context\n"
        "assert 'torch' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
