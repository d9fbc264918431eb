"""The front doors' side of the launch options: ``orch.launch``, ``orch.sweep`` and
``orch.gang`` take them as keywords typed by :class:`LaunchOptions` and :class:`RunOptions`
(a test holds their keys to :class:`~orch.launchers.spec.LaunchSpec`'s fields) and hand them
over as they came (:func:`spec_of`); the command line's ``orch run``, ``orch sweep`` and
``orch master`` add their flags as declared (:func:`add_flag`) and read them back
(:func:`from_flags`)."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Mapping
from typing import Any, TypedDict

from orch.errors import ConfigError, PortInUseError
from orch.launchers.clusters import Cluster
from orch.launchers.spec import Front, LaunchSpec, options


class RunOptions(TypedDict, total=False):
    """The options every run takes (``orch.launch``'s and each run's of ``orch.sweep``), as
    keywords. Their defaults, checks and help are :class:`LaunchSpec`'s (``front="run"``)."""

    args: list[Any] | tuple[Any, ...] | None
    module: str | None
    steps: int | None
    heartbeat_timeout: float
    hang_timeout: float | None
    on_hang: str
    startup_timeout: float
    stop_grace: float
    threads: int | None
    max_restarts: int
    value_cap: int


class LaunchOptions(RunOptions, total=False):
    """``orch.launch``'s keywords: every run's, and a run's own (``front="launch"``): its
    ports, folder, secret, name and cluster, which the runs of a sweep do not share."""

    master_port: int | None
    rdzv_port: int | None
    run_root: str
    tls_cert: str | None
    tls_key: str | None
    tls_ca: str | None
    token: str | None
    name: str | None
    cluster: Cluster | None
    min_world_size: int | None
    seed: int | None


def keys_of(options: type) -> frozenset[str]:
    """The keywords a TypedDict of options takes."""
    return frozenset(options.__required_keys__ | options.__optional_keys__)  # type: ignore[attr-defined]


def spec_of(where: str, taken: type, options: Mapping[str, Any], **fixed: Any) -> LaunchSpec:
    """The :class:`LaunchSpec` a front door's keywords ask for; an option it does not take (a
    typo, one of another door's) is a :class:`ConfigError` that names it and what is meant."""
    allowed = keys_of(taken)
    for name in options:
        if name in allowed:
            continue
        if name in keys_of(LaunchOptions):
            raise ConfigError(
                f"{where}() does not take {name}=: it is a launch's own option (each run of a sweep "
                "picks its own); pass it to orch.launch"
            )
        near = difflib.get_close_matches(name, sorted(allowed), n=1)
        hint = f": did you mean {near[0]}=?" if near else ""
        raise ConfigError(
            f"{where}() got an unknown option {name}={options[name]!r:.40}{hint} "
            f"(its options: {', '.join(sorted(allowed))})"
        )
    return LaunchSpec(**fixed, **options)


def from_flags(args: argparse.Namespace, taken: type | None = None) -> dict[str, Any]:
    """The launch options a command line's flags gave (those :func:`add_flag` added), by name;
    only those of ``taken`` (a TypedDict of options) when given."""
    wanted = keys_of(taken) if taken is not None else options().keys()
    return {name: value for name, value in vars(args).items() if name in wanted}


def flagged(front: Front) -> list[str]:
    """The options a front door of ``front`` takes that have a command-line flag, in order."""
    return [name for name, (o, _) in options().items() if o.front == front and o.flag is not None]


def options_doc(taken: type) -> str:
    """The keyword options a front door takes, with their defaults and help, for its docstring."""
    keys = keys_of(taken)
    lines = [f"``{n}`` (default ``{d!r}``): {o.help}." for n, (o, d) in options().items() if n in keys]
    return "\n\n    Keyword options (declared in :class:`orch.launchers.spec.LaunchSpec`):\n\n" + "\n".join(
        f"    - {line}" for line in lines
    )


def as_flag(error: PortInUseError) -> PortInUseError:
    """A taken port named as the command line names it: ``master_port`` is ``--master-port``
    (the error itself when its option has no flag)."""
    declared = options().get(error.option)
    if declared is None or declared[0].flag is None:
        return error
    return PortInUseError(error.port, error.what, declared[0].flag)


def add_flag(parser: Any, name: str, *aliases: str, **override: Any) -> None:
    """Add the flag of launch option ``name`` to an argparse ``parser``: its spelling, default,
    check and help as declared (``override`` changes what one command says otherwise)."""
    declared, default = options()[name]
    if declared.flag is None:
        raise ValueError(f"launch option {name} has no command-line flag")
    flag = override.pop("flag", declared.flag)

    def read(text: str) -> Any:
        try:
            value = declared.parse(text) if declared.parse is not None else text
            if declared.check is not None:
                declared.check(name, value)
        except ConfigError as e:  # a ValueError too: first
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"{name} ")) from e
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"not a valid value: {text!r}") from e
        return value

    settings: dict[str, Any] = {"type": read, "default": default, "help": declared.help, "dest": name}
    settings.update(override)
    parser.add_argument(flag, *aliases, **settings)
