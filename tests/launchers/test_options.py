"""Each launch option is declared once (orch.launchers.spec.LaunchSpec); the keywords of
orch.launch and orch.sweep (typed by LaunchOptions and RunOptions), and the command line's
flags, are held to that declaration."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import typing
from typing import Any

import pytest

import orch
from orch.cli import build_parser
from orch.launchers.front import LaunchOptions, RunOptions, add_flag, flagged, keys_of, spec_of
from orch.launchers.spec import LaunchSpec, option, options

# Parameters of launch() and sweep() that are not launch options (a sweep's own: how it
# searches and prunes), and launch options a signature spells another way.
NOT_OPTIONS = {
    "detach", "apart", "configs", "parallel", "max_failures", "reuse",
    "trials", "search", "metric", "mode", "prune", "seed", "order", "options",
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
    # the implementation and its typed overloads: in-process, apart, detached, and apart left to the process
    assert len(signatures) == 5
    wrong = [w for s in signatures for w in _held(s, "launch")]
    assert not wrong, wrong
    for s in signatures:
        rest = inspect.signature(s).parameters["options"]
        assert rest.kind is inspect.Parameter.VAR_KEYWORD and rest.annotation == "Unpack[LaunchOptions]"


def test_sweep_is_held_to_the_declared_options() -> None:
    assert not _held(orch.sweep, "sweep")
    rest = inspect.signature(orch.sweep).parameters["options"]
    assert rest.kind is inspect.Parameter.VAR_KEYWORD and rest.annotation == "Unpack[RunOptions]"


def _typed(options_type: type) -> dict[str, Any]:
    return typing.get_type_hints(options_type)


def _front_door_mismatches(spec: type, run_options: type, launch_options: type) -> list[str]:
    """Where the typed keywords of the front doors and the declared fields of ``spec`` differ."""
    fields = {f.name: f for f in dataclasses.fields(spec)}
    hints = typing.get_type_hints(spec)
    fronts = {name: f.metadata["option"].front for name, f in fields.items()}
    wanted = {
        run_options: {n for n, front in fronts.items() if front == "run"},
        launch_options: {n for n, front in fronts.items() if front in ("run", "launch")},
    }
    wrong = []
    for typed, names in wanted.items():
        keys = keys_of(typed)
        wrong += [f"{typed.__name__} has no keyword for {spec.__name__}.{n}" for n in sorted(names - keys)]
        wrong += [f"{typed.__name__}.{n} is no option of {spec.__name__}" for n in sorted(keys - names)]
        for name, typ in _typed(typed).items():
            if name in hints and typ != hints[name]:
                wrong.append(f"{typed.__name__}.{name} is {typ}, {spec.__name__}.{name} is {hints[name]}")
    return wrong


def test_the_typed_keywords_are_the_declared_options_of_their_front_door() -> None:
    """A launch option declared with front="run" is a keyword of launch and sweep, one with
    front="launch" of launch alone, with the declared field's type; orch's own are neither."""
    assert _front_door_mismatches(LaunchSpec, RunOptions, LaunchOptions) == []


def test_a_keyword_missing_from_a_front_door_is_found() -> None:
    """The check above fails for an option declared without its keyword, a keyword without
    its option, and a keyword typed otherwise than its field."""

    @dataclasses.dataclass
    class More(LaunchSpec):
        patience: int = option(3, help="a new run option", front="run")

    class Fewer(RunOptions, total=False):  # every run option, one retyped
        steps: str  # type: ignore[misc]

    class Extra(LaunchOptions, total=False):
        bogus: int

    assert _front_door_mismatches(More, RunOptions, LaunchOptions) == [
        "RunOptions has no keyword for More.patience",
        "LaunchOptions has no keyword for More.patience",
    ]
    assert _front_door_mismatches(LaunchSpec, Fewer, Extra) == [
        "Fewer.steps is <class 'str'>, LaunchSpec.steps is int | None",
        "Extra.bogus is no option of LaunchSpec",
    ]


def test_an_option_a_front_door_does_not_take_names_it_and_what_was_meant() -> None:
    with pytest.raises(orch.ConfigError, match=r"unknown option hang_timout=5.*did you mean hang_timeout="):
        orch.launch(hang_timout=5)  # type: ignore[call-arg]
    with pytest.raises(orch.ConfigError, match=r"orch.sweep\(\) does not take master_port="):
        orch.sweep(None, [{"lr": 0.1}], master_port=6000)  # type: ignore[call-arg]
    # and the value it does take is checked as the declaration says
    with pytest.raises(orch.ConfigError, match="hang_timeout must be a positive"):
        spec_of("orch.sweep", RunOptions, {"hang_timeout": -1.0})


def test_a_sweeps_runs_take_every_run_option() -> None:
    """orch.sweep(hang_timeout=..., on_hang=...) reaches each of its runs (it took 4 before)."""
    spec = spec_of(
        "orch.sweep",
        RunOptions,
        {"hang_timeout": 45.0, "on_hang": "fail", "stop_grace": 3.0, "max_restarts": 2},
        fn=None,
        world_size=2,
        config={"lr": 0.1},
    )
    assert (spec.hang_timeout, spec.on_hang, spec.stop_grace, spec.max_restarts) == (45.0, "fail", 3.0, 2)


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


RUN_FLAGS = flagged("run")  # every run's options: every command that starts runs has them
FROM_DECLARATION = {
    "run": ["fn", "config", "rdzv_port", *RUN_FLAGS, "world_size", "master_port", "run_root", "seed"],
    "master": ["fn", "config", "rdzv_port", *RUN_FLAGS, "world_size", "master_host", "tls_cert",
               "tls_key", "master_port", "run_root", "min_world_size", "seed"],
    "sweep": ["fn", "config", *RUN_FLAGS, "world_size", "run_root"],
}  # fmt: skip
# Help a command words its own way (what the option means there), against the declaration's.
OWN_HELP = {
    ("run", "world_size"),
    ("master", "max_restarts"),
    *(("sweep", n) for n in ("fn", "config", "steps", "world_size", "heartbeat_timeout")),
}


def test_every_flagged_option_is_a_flag_of_a_command() -> None:
    """An option declared with a flag that no command offers fails here."""
    offered = {name for names in FROM_DECLARATION.values() for name in names}
    assert {n for n, (o, _) in options().items() if o.flag is not None} <= offered
    assert set(RUN_FLAGS) >= {"steps", "heartbeat_timeout", "hang_timeout", "on_hang", "max_restarts"}


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
