"""orch's shape: layers that import one way, no cycle hidden in a function, a light worker.

``lint-imports`` (run by scripts/test.sh, contract in pyproject.toml) holds the direction
between layers; these tests hold what it does not see: cycles inside a layer, imports
moved into functions to dodge a cycle, and what a worker process loads.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "orch"

# An orch module imported inside a function, allowed only to keep a heavy dependency out of
# processes that never use it: (importing module, imported module, the dependency it defers).
HEAVY = {
    ("orch", "orch.views.panel"): "ipywidgets, matplotlib",
    ("orch", "orch.views.sweep_panel"): "ipywidgets, matplotlib",
    ("orch", "orch.views.gang_panel"): "ipywidgets, matplotlib",
    ("orch", "orch._magic"): "torch, grpc: the launchers, when a %%orch cell first runs",
    ("orch.runtime.worker", "orch.runtime.context"): "torch",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "_proto" not in p.parts}


def _imports(path: Path, modules: set[str], name: str | None = None) -> list[tuple[str, int, bool]]:
    """(imported orch module, line, inside a function) for every import of the file, those
    under ``if TYPE_CHECKING`` included (they name the same dependency)."""
    tree = ast.parse(path.read_text())
    name = name or _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(n) for n in ast.walk(node) if n is not node)
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        for target in targets:
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target in modules and target != name and target.startswith("orch"):
                found.append((target, node.lineno, id(node) in in_function))
    return found


def _graph() -> dict[str, set[str]]:
    sources = _sources()
    modules = set(sources)
    return {m: {t for t, _, _ in _imports(p, modules) if t != "orch"} for m, p in sources.items()}


def test_no_orch_module_is_imported_inside_a_function_but_to_defer_a_heavy_dependency() -> None:
    sources = _sources()
    hidden = [
        f"{p.relative_to(ROOT)}:{line} imports {target}"
        for m, p in sources.items()
        for target, line, inside in _imports(p, set(sources))
        if inside and (m, target) not in HEAVY
    ]
    assert not hidden, "import these at the top of the module (a cycle hides here):\n" + "\n".join(hidden)


def test_the_allowed_function_imports_are_still_needed() -> None:
    # An allow-list entry whose import moved to the top, or went away, is taken out of it.
    sources = _sources()
    used = {
        (m, target) for m, p in sources.items() for target, _, inside in _imports(p, set(sources)) if inside
    }
    assert set(HEAVY) <= used, f"stale entries: {set(HEAVY) - used}"


def test_no_import_cycles_counting_imports_inside_functions() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_import_reader_sees_imports_inside_functions(tmp_path: Path) -> None:
    # The checks above would pass on files they cannot read: show that they read these.
    modules = {"orch.a", "orch.b"}
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("def f():\n    from orch.b import x\n")
    b.write_text("from orch import a\n")
    assert [(t, inside) for t, _, inside in _imports(a, modules, "orch.a")] == [("orch.b", True)]
    assert [(t, inside) for t, _, inside in _imports(b, modules, "orch.b")] == [("orch.a", False)]


# What a rank imports before it runs the user's function: the worker runtime, the wire, the
# record's store and the base modules; nothing of the master, the launchers, the views.
WORKER_LAYERS = ("orch.runtime", "orch.wire", "orch.record", "orch.errors", "orch._")
NOT_IN_A_WORKER = ("rich", "ipywidgets", "matplotlib", "IPython")


def _loaded_by(module: str) -> list[str]:
    """Every module a fresh interpreter holds after importing ``module``."""
    code = f"import json, sys\nimport {module}\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_a_worker_process_loads_only_the_runtime_and_the_wire() -> None:
    loaded = _loaded_by("orch.runtime.worker")
    ours = [m for m in loaded if m.startswith("orch.")]
    outside = [m for m in ours if not m.startswith(WORKER_LAYERS)]
    assert not outside, f"a worker loads {outside}"
    assert "orch.master" not in loaded and "orch.launchers" not in loaded
    # The host agent's relay is a gRPC server; a rank process does not load it.
    assert "orch.runtime.agent" not in loaded and "orch.runtime.host" not in loaded
    heavy = [m for m in NOT_IN_A_WORKER if m in loaded]
    assert not heavy, f"a worker loads {heavy}"
    assert "grpc" in loaded and "orch.runtime.worker" in ours  # the check saw the real imports


def test_orch_worker_the_entry_point_of_torchrun_and_srun_loads_no_master_launcher_or_view() -> None:
    loaded = _loaded_by("orch.worker")
    upper = ("orch.master", "orch.launchers", "orch.views", "orch.experiments")
    above = [m for m in loaded if m.startswith(upper)]
    assert not above and "orch.cli" not in loaded, above
    assert not [m for m in NOT_IN_A_WORKER if m in loaded]
    assert "orch._worker_cli" in loaded and "orch.runtime.host" in loaded  # it can run a host's ranks


# -- writes: every one in orch/ goes through orch/record/writes.py --------------------------------
WRITER = "orch/record/writes.py"
WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}
# Calls that make, change or remove a file or folder by its path.
WRITE_CALLS = {
    "os": {"mkdir", "makedirs", "replace", "rename", "renames", "unlink", "remove", "rmdir", "symlink",
           "link", "chmod", "chown", "truncate", "mkfifo", "mknod"},
    "shutil": {"copy", "copy2", "copyfile", "copytree", "move", "rmtree", "copymode", "copystat"},
    "tempfile": {"mkdtemp", "mkstemp", "NamedTemporaryFile", "TemporaryDirectory"},
}  # fmt: skip
PATH_WRITES = {"mkdir", "write_text", "write_bytes", "unlink", "rmdir", "touch", "symlink_to", "hardlink_to",
               "rename", "chmod"}  # fmt: skip
# Writes that are not in a run root, each with why.
OUTSIDE_THE_RUN_ROOT = {
    ("orch/wire/net.py", "mkdtemp"): "a private socket's own 0700 folder under the temp dir",
    ("orch/wire/net.py", "rmtree"): "that folder, and stale ones of this user's (checked by owner first)",
}


def _writes(path: Path) -> list[tuple[int, str]]:
    """The lines of ``path`` that write to the file system other than through the writer."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "open":
            given = [k.value for k in node.keywords if k.arg == "mode"]
            mode = node.args[1] if len(node.args) > 1 else (given[0] if given else None)
            text = mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else "r"
            if mode is not None and not isinstance(mode, ast.Constant):
                text = "?"
            if set(text) & set("wax+?"):
                found.append((node.lineno, f"open(..., {text!r})"))
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            if f.value.id == "os" and f.attr == "open" and len(node.args) > 1:
                named = {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
                if named & WRITE_FLAGS:
                    found.append((node.lineno, "os.open(..., " + "|".join(sorted(named & WRITE_FLAGS)) + ")"))
            elif f.attr in WRITE_CALLS.get(f.value.id, ()):
                found.append((node.lineno, f"{f.value.id}.{f.attr}"))
            elif f.value.id not in WRITE_CALLS and f.attr in PATH_WRITES:
                found.append((node.lineno, f".{f.attr}()"))
        elif isinstance(f, ast.Attribute) and f.attr in PATH_WRITES and not isinstance(f.value, ast.Name):
            found.append((node.lineno, f".{f.attr}()"))
    return found


def test_every_write_in_orch_goes_through_the_writer() -> None:
    """A run root may be shared: a write that bypasses orch/record/writes.py (its link, owner
    and mode checks, O_EXCL|O_NOFOLLOW files) could follow what another user planted there."""
    bypasses = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == WRITER or "/_proto/" in rel:
            continue
        for line, call in _writes(path):
            name = call.split("(")[0].split(".")[-1].strip("()") or call
            if (rel, name) not in OUTSIDE_THE_RUN_ROOT:
                bypasses.append(f"{rel}:{line}: {call}")
    assert bypasses == [], "writes that bypass orch/record/writes.py:\n" + "\n".join(bypasses)


def test_the_write_finder_finds_writes(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os, shutil\nfrom pathlib import Path\n"
        "open('x', 'w')\nopen('x')\nos.open('x', os.O_WRONLY | os.O_CREAT)\nos.open('x', os.O_RDONLY)\n"
        "Path('x').write_text('y')\nos.replace('a', 'b')\nshutil.copy2('a', 'b')\n(Path('a') / 'b').mkdir()\n"
        "'abc'.replace('a', 'b')\n"
    )
    assert [line for line, _ in _writes(sample)] == [3, 5, 7, 8, 9, 10]
