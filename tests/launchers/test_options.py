"""Each launch option is declared once (orch.launchers.spec.LaunchSpec); the typed signatures of
orch.launch and orch.sweep, and the command line's flags, are held to that declaration."""

from __future__ import annotations

import argparse
import inspect
import typing
from typing import Any

import pytest

import orch
from orch.cli import build_parser
from orch.launchers.spec import LaunchSpec, add_flag, options

# Parameters of launch() and sweep() that are not launch options (a sweep's own: how it
# searches and prunes), and launch options a signature spells another way.
NOT_OPTIONS = {
    "detach", "configs", "parallel", "max_failures", "reuse",
    "trials", "search", "metric", "mode", "prune", "seed", "order",
}  # fmt: skip
SPELLED = {"train": "fn"}
# Defaults a signature sets on purpose: a sweep's runs are small by default; config=None
# is a fresh {} per call.
OWN_DEFAULTS = {("sweep", "world_size"): 2, ("launch", "config"): None, ("sweep", "name"): None}


def _held(fn: Any, label: str) -> list[str]:
    declared = options()
    wrong = []
    for name, p in inspect.signature(fn).parameters.items():
        if name in NOT_OPTIONS:
            continue
        option = SPELLED.get(name, name)
        if option not in declared:
            wrong.append(f"{label}({name}=...) is not a declared launch option")
            continue
        want = OWN_DEFAULTS.get((label, name), declared[option][1])
        if p.default is not inspect.Parameter.empty and p.default != want and option != "fn":
            wrong.append(f"{label}({name}={p.default!r}) but LaunchSpec.{option} defaults to {want!r}")
    return wrong


def test_launch_and_its_overloads_are_held_to_the_declared_options() -> None:
    signatures = [orch.launch, *typing.get_overloads(orch.launch)]
    assert len(signatures) == 4  # the implementation and its three typed overloads
    wrong = [w for s in signatures for w in _held(s, "launch")]
    assert not wrong, wrong


def test_sweep_is_held_to_the_declared_options() -> None:
    assert not _held(orch.sweep, "sweep")


def test_a_default_that_drifts_is_found() -> None:
    # The check above would pass on a signature it could not read: show it reads one.
    def launch(train: Any = None, world_size: int = 8, heartbeat_timeout: float = 30.0) -> None: ...

    def sweep(train: Any, bogus: int = 1) -> None: ...

    assert _held(launch, "launch") == ["launch(world_size=8) but LaunchSpec.world_size defaults to 4"]
    assert _held(sweep, "sweep") == ["sweep(bogus=...) is not a declared launch option"]


def _flags(command: str) -> dict[str, Any]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return {a.dest: a for a in sub.choices[command]._actions}  # type: ignore[attr-defined]


COMMON = ["fn", "steps", "config", "rdzv_port", "heartbeat_timeout"]
FROM_DECLARATION = {
    "run": [*COMMON, "world_size", "master_port", "run_root", "max_restarts"],
    "master": [*COMMON, "world_size", "master_host", "tls_cert", "tls_key", "master_port", "run_root",
               "max_restarts", "min_world_size"],
    "sweep": ["fn", "config", "steps", "world_size", "run_root", "heartbeat_timeout"],
}  # fmt: skip
# Help a command words its own way (what the option means there), against the declaration's.
OWN_HELP = {
    ("run", "world_size"),
    ("master", "max_restarts"),
    *(("sweep", n) for n in FROM_DECLARATION["sweep"]),
}


@pytest.mark.parametrize("command", sorted(FROM_DECLARATION))
def test_a_commands_launch_flags_are_built_from_the_declaration(command: str) -> None:
    declared = options()
    flags = _flags(command)
    for name in FROM_DECLARATION[command]:
        action = flags[name]
        assert action.type.__qualname__ == "add_flag.<locals>.read", (command, name)
        if (command, name) not in OWN_HELP:
            assert action.help == declared[name][0].help, (command, name)
        if declared[name][0].check is not None:
            with pytest.raises(Exception, match="must be"):
                action.type("-5")  # the declared check refuses it, as LaunchSpec would


def test_the_cli_and_the_api_refuse_a_value_in_the_same_words() -> None:
    with pytest.raises(orch.ConfigError) as api:
        LaunchSpec(max_restarts=-1)
    parser = argparse.ArgumentParser()
    add_flag(parser, "max_restarts")
    with pytest.raises(argparse.ArgumentTypeError) as cli:
        parser._actions[-1].type("-1")  # type: ignore[misc]
    assert str(api.value) == f"max_restarts {cli.value}"
