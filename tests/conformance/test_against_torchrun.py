"""A rank under orch is a torchrun rank: the same program under ``torchrun --standalone`` and
under each of orch's doors, and what its ranks observe compared.

Every row of :data:`TABLE` is a rule this suite checks at each door where it applies, and the
table written in docs/existing-code.md ("What differs from torchrun") is this one
(:func:`test_the_docs_table_is_this_suites`). A difference kept on purpose is a row that says
so; anything else that differs fails here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import torch

import orch
from probes import ORCH, TORCHRUN, clean_env, observed, run, workspace

pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("conformance")]

ROOT = Path(__file__).resolve().parents[2]
DOORS = ("orch run", "orch run -m", "launch(script)", "launch(fn)", "launch(fn, args)", "gang call")
SCRIPTS = DOORS[:3]  # the doors that run the program as __main__
WILDCARD = ("00000000:", "00000000000000000000000000000000:")

# (observable, what torchrun's ranks see, what orch's see, the doors where it is checked)
TABLE: list[tuple[str, str, str, tuple[str, ...]]] = [
    ("RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_*, "
     "TORCHELASTIC_RESTART_COUNT", "set", "the same", DOORS),
    ("MASTER_ADDR", "localhost (--standalone)", "127.0.0.1: rank 0's address (the same host)", DOORS),
    ("OMP_NUM_THREADS, torch threads (intra-op)", "1 per rank (2 ranks)", "the same", DOORS),
    ("TORCHELASTIC_USE_AGENT_STORE", "True (the agent's store)", "False: orch's store, no agent", DOORS),
    ("MASTER_PORT", "the agent's store", "a free port nothing listens on (one host)", DOORS),
    ("random state at start (torch, numpy, random)", "its own per rank, per launch",
     "the same: its own per rank, per launch", DOORS),
    ("random state with a seed", "the code's torch.manual_seed(s + RANK) ...",
     "seed=s (--seed s) gives the same draws as that code", ("orch run",)),
    ("cwd, sys.argv, sys.path[0], __name__, __main__.__file__", "the script's",
     "the same", SCRIPTS),
    ("init_process_group() with no backend", "torch's default (cpu:gloo, cuda:nccl)", "the same", SCRIPTS),
    ("process group of a function", "made by the code", "made by orch before the function runs (gloo "
     "on CPU, nccl on GPUs); the code's init_process_group joins it", ("launch(fn)", "launch(fn, args)",
     "gang call")),
    ("a TCP listener on MASTER_PORT or a wildcard address in a rank", "none", "none", DOORS),
    ("parameters after training (DDP)", "-", "equal, bit for bit", DOORS),
    ("init_device_mesh, FSDP2 fully_shard: parameters, listeners", "-",
     "equal, bit for bit; no listener on MASTER_PORT or a wildcard address", ("orch run",)),
    ("a rank's sys.exit(3): the launcher's exit code", "1", "1", ("orch run",)),
    ("rank 0's output; files the script writes in its folder", "in the terminal; written",
     "the same", ("orch run",)),
]  # fmt: skip


def render() -> str:
    """The table as docs/existing-code.md shows it."""
    lines = ["| observable | torchrun | orch | checked at |", "| --- | --- | --- | --- |"]
    for what, theirs, ours, doors in TABLE:
        where = "every door" if doors == DOORS else ", ".join(f"`{d}`" for d in doors)
        lines.append(f"| {what} | {theirs} | {ours} | {where} |")
    return "\n".join(lines)


def test_the_docs_table_is_this_suites() -> None:
    text = (ROOT / "docs" / "existing-code.md").read_text()
    start, end = "<!-- conformance:table -->\n", "\n<!-- /conformance:table -->"
    assert start in text and end in text, "docs/existing-code.md lost its conformance table's markers"
    shown = text.split(start, 1)[1].split(end, 1)[0]
    assert shown == render(), "docs/existing-code.md's table differs from tests/conformance's TABLE"


class Runs:
    """Each door's observations (``rank<R>.json`` of both ranks) and parameters, by name."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.seen: dict[str, list[dict[str, Any]]] = {}
        self.params: dict[str, list[dict[str, torch.Tensor]]] = {}

    def out(self, name: str) -> Path:
        return self.base / "out" / name.replace(" ", "_").replace("(", "").replace(")", "").replace(",", "")

    def collect(self, name: str) -> None:
        out = self.out(name)
        self.seen[name] = observed(out)
        self.params[name] = [torch.load(out / f"params-rank{r}.pt", weights_only=True) for r in (0, 1)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    base = tmp_path_factory.mktemp("conformance")
    work = workspace(base)
    r = Runs(base)

    def cli(name: str, *cmd: str) -> None:
        run([*cmd], cwd=work)
        r.collect(name)

    torchrun = [TORCHRUN, "--standalone", "--nproc-per-node", "2"]
    cli("torchrun", *torchrun, "probe.py", str(r.out("torchrun")))
    cli("orch run", ORCH, "run", "--workers", "2", "probe.py", str(r.out("orch run")))
    cli("orch run -m", ORCH, "run", "--workers", "2", "-m", "pkg.probe", str(r.out("orch run -m")))
    # Seeded: the code seeding itself under torchrun, and orch's seed= (twice: the same draws).
    cli("torchrun seeded", *torchrun, "probe.py", str(r.out("torchrun seeded")), "--seed", "7")
    for n in (1, 2):
        cli(
            f"orch seeded {n}",
            ORCH,
            "run",
            "--workers",
            "2",
            "--seed",
            "7",
            "probe.py",
            str(r.out(f"orch seeded {n}")),
        )
    for how in ("mesh", "fsdp"):
        cli(f"torchrun {how}", *torchrun, "probe.py", str(r.out(f"torchrun {how}")), f"--{how}")
        cli(
            f"orch run {how}",
            ORCH,
            "run",
            "--workers",
            "2",
            "probe.py",
            str(r.out(f"orch run {how}")),
            f"--{how}",
        )

    # From Python, in the user's folder, as a notebook's kernel runs them.
    before = os.getcwd()
    sys.path.insert(0, str(work))
    os.chdir(work)
    try:
        import probe  # the user's module, as a notebook imports it

        cloudpickle.register_pickle_by_value(probe)
        root = str(base / "runs")
        for name, fn, options in (
            ("launch(script)", "probe.py", {"args": [str(r.out("launch(script)"))]}),
            ("launch(fn)", "probe:of_ctx", {"config": {"out": str(r.out("launch(fn)"))}}),
            ("launch(fn) again", "probe:of_ctx", {"config": {"out": str(r.out("launch(fn) again"))}}),
            ("launch(fn, args)", probe.without_ctx, {"args": (str(r.out("launch(fn, args)")),)}),
        ):
            with orch.launch(fn, world_size=2, run_root=root, **options) as launched:
                assert launched.wait(timeout=240).state is orch.RunState.SUCCEEDED
            r.collect(name)
        gang = orch.gang(world_size=2, run_root=root)
        try:
            assert (
                gang.run(probe.in_gang, str(r.out("gang call"))).wait(timeout=240).state
                is orch.RunState.SUCCEEDED
            )
        finally:
            gang.close()
        r.collect("gang call")
        cloudpickle.unregister_pickle_by_value(probe)
    finally:
        os.chdir(before)
        sys.path.remove(str(work))
        sys.modules.pop("probe", None)
    yield r


def _draws(seen: dict[str, Any]) -> tuple[Any, ...]:
    return (seen["initial_seed"], tuple(seen["torch_draw"]), tuple(seen["numpy_draw"]), seen["random_draw"])


@pytest.mark.parametrize("door", DOORS)
def test_the_torchrun_environment(runs: Runs, door: str) -> None:
    for theirs, ours in zip(runs.seen["torchrun"], runs.seen[door], strict=True):
        for name, value in theirs["env"].items():
            if name == "MASTER_PORT":
                assert ours["env"][name] and ours["env"][name].isdigit()
            elif name == "TORCHELASTIC_USE_AGENT_STORE":  # kept on purpose (TABLE)
                assert (value, ours["env"][name]) == ("True", "False")
            elif name == "MASTER_ADDR":  # kept on purpose (TABLE)
                assert (value, ours["env"][name]) == ("localhost", "127.0.0.1")
            else:
                assert ours["env"][name] == value, (door, name)
        assert ours["threads"] == theirs["threads"], door


@pytest.mark.parametrize("door", DOORS)
def test_each_rank_draws_its_own_random_numbers(runs: Runs, door: str) -> None:
    """Per rank, and per launch: no two ranks of any door or launch draw alike."""
    ranks = [_draws(seen) for seen in runs.seen[door]]
    assert ranks[0] != ranks[1]
    for part in range(4):  # each generator on its own: torch's seed, torch, numpy and random
        assert ranks[0][part] != ranks[1][part], (door, part)
    others = {
        d for name, s in runs.seen.items() if name != door and "seeded" not in name for d in map(_draws, s)
    }
    assert not set(ranks) & others, f"{door} drew what another launch drew"


def test_two_launches_in_one_process_draw_apart(runs: Runs) -> None:
    firsts = {_draws(s)[1] for s in runs.seen["launch(fn)"]}
    seconds = {_draws(s)[1] for s in runs.seen["launch(fn) again"]}
    assert len(firsts | seconds) == 4


def test_seed_gives_what_the_code_seeding_itself_gets(runs: Runs) -> None:
    ours1, ours2, theirs = (
        runs.seen["orch seeded 1"],
        runs.seen["orch seeded 2"],
        runs.seen["torchrun seeded"],
    )
    for r in (0, 1):
        assert _draws(ours1[r]) == _draws(ours2[r]) == _draws(theirs[r])
    assert _draws(ours1[0]) != _draws(ours1[1])


@pytest.mark.parametrize("door", SCRIPTS)
def test_a_script_runs_where_and_as_torchrun_runs_it(runs: Runs, door: str) -> None:
    for theirs, ours in zip(runs.seen["torchrun"], runs.seen[door], strict=True):
        for key in ("cwd", "name", "backend"):
            assert ours[key] == theirs[key], (door, key)
        assert ours["backend"] == "undefined"  # torch's own default: cpu:gloo, cuda:nccl
        assert ours["argv"] == [str(runs.out(door))]
        if door == "orch run -m":
            assert (ours["path0"], ours["main_file"]) == (theirs["path0"], "probe.py")
        else:
            assert (ours["path0"], ours["argv0"], ours["main_file"]) == (
                theirs["path0"], theirs["argv0"], theirs["main_file"]
            )  # fmt: skip


@pytest.mark.parametrize("door", ("launch(fn)", "launch(fn, args)", "gang call"))
def test_a_function_finds_the_group_made(runs: Runs, door: str) -> None:
    assert [s["backend"] for s in runs.seen[door]] == ["gloo", "gloo"]


def _listeners_ok(seen: dict[str, Any]) -> None:
    port = seen["env"]["MASTER_PORT"]
    for where in (*seen["listening"], *seen["listening_after"]):
        assert not where.startswith(WILDCARD), f"a rank listens on a wildcard address: {where}"
        assert not where.endswith(f":{port}"), f"a rank listens on MASTER_PORT: {where}"


@pytest.mark.parametrize("door", ("torchrun", *DOORS, "orch run mesh", "orch run fsdp"))
def test_no_rank_listens_on_master_port_or_a_wildcard_address(runs: Runs, door: str) -> None:
    for seen in runs.seen[door]:
        _listeners_ok(seen)


@pytest.mark.parametrize("door", (*DOORS, "mesh", "fsdp"))
def test_the_parameters_are_torchruns_bit_for_bit(runs: Runs, door: str) -> None:
    theirs, ours = (
        (runs.params[f"torchrun {door}"], runs.params[f"orch run {door}"])
        if door in ("mesh", "fsdp")
        else (runs.params["torchrun"], runs.params[door])
    )
    for rank in (0, 1):
        assert theirs[rank].keys() == ours[rank].keys()
        for name, value in theirs[rank].items():
            assert torch.equal(ours[rank][name], value), (door, rank, name)
    assert not torch.equal(theirs[0]["0.weight" if door == "fsdp" else "module.0.weight"], torch.zeros(16, 8))


FAILS = """
import os, sys
import torch.distributed as dist
dist.init_process_group()
print(f"rank {os.environ['RANK']} says hello", flush=True)
with open(f"wrote-{os.environ['RANK']}.txt", "w") as f:
    f.write(os.environ["RANK"])
if os.environ["RANK"] == "1":
    sys.exit(3)
dist.destroy_process_group()
"""


def test_a_failing_scripts_exit_code_output_and_files(tmp_path: Path) -> None:
    outcomes = {}
    for who, cmd in (
        ("torchrun", [TORCHRUN, "--standalone", "--nproc-per-node", "2", "fails.py"]),
        ("orch run", [ORCH, "run", "--workers", "2", "fails.py"]),
    ):
        folder = tmp_path / who.replace(" ", "_")
        folder.mkdir()
        (folder / "fails.py").write_text(FAILS)
        proc = subprocess.run(cmd, cwd=folder, env=clean_env(), capture_output=True, text=True, timeout=240)
        wrote = {p.name: p.read_text() for p in folder.glob("wrote-*.txt")}
        outcomes[who] = (proc.returncode, "rank 0 says hello" in proc.stdout + proc.stderr, wrote)
    assert outcomes["orch run"] == outcomes["torchrun"] == (1, True, {"wrote-0.txt": "0", "wrote-1.txt": "1"})
