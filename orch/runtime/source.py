"""Tracebacks from the workers that show the user's own code, as IPython shows it.

cloudpickle carries a notebook-defined function by value and renames its code's file to
``<dynamic-code>``; the cell's source lives only in the notebook kernel's ``linecache``. So
a rank's traceback would read ``File "<dynamic-code>", line 17, in bad_day`` with no source
line. The launcher collects, for every function the training function can reach, the file
it came from, the source lines of the files a worker cannot read (notebook cells) and
IPython's label for them (``Cell In[2]``); the worker puts the file names back on the code
objects, the lines into its ``linecache`` and formats frames of cells as IPython does.
"""

from __future__ import annotations

import contextlib
import functools
import linecache
import os
import re
import sys
import types
from dataclasses import dataclass, field
from typing import Any

from orch.runtime.target import Called

MAX_OBJECTS = 2000  # a bound on the walk through globals, for a notebook full of functions
MAX_SOURCE_BYTES = 4 * 1024 * 1024

CodeKey = tuple[str, int, bytes]


@dataclass
class SourceMap:
    """Where the code of a training function came from; travels to the workers with it."""

    files: dict[CodeKey, str] = field(default_factory=dict)  # code -> its original file name
    lines: dict[str, list[str]] = field(default_factory=dict)  # file name -> source lines
    labels: dict[str, str] = field(default_factory=dict)  # file name -> "Cell In[2]"
    # Where a function of __main__ was defined, as a person names it (see :func:`origin_of`).
    origin: str = ""

    def __bool__(self) -> bool:
        return bool(self.files)


def _key(code: types.CodeType) -> CodeKey:
    # What cloudpickle keeps of a code object: its qualified name, first line and bytecode.
    return (code.co_qualname, code.co_firstlineno, code.co_code)


def _codes(code: types.CodeType) -> list[types.CodeType]:
    found = [code]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found.extend(_codes(const))
    return found


def _reachable_functions(fn: Any) -> list[types.FunctionType]:
    """``fn`` and the functions (and methods of classes) it reaches through its globals and closure."""
    seen: set[int] = set()
    out: list[types.FunctionType] = []
    todo = [fn]
    while todo and len(seen) < MAX_OBJECTS:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, types.MethodType):
            todo.append(obj.__func__)
        elif isinstance(obj, Called):
            todo.append(obj.__wrapped__)
        elif isinstance(obj, functools.partial):
            todo.append(obj.func)
        elif isinstance(obj, types.FunctionType):
            out.append(obj)
            names = {name for code in _codes(obj.__code__) for name in code.co_names}
            todo.extend(obj.__globals__[n] for n in names if n in obj.__globals__)
            todo.extend(c.cell_contents for c in obj.__closure__ or () if _filled(c))
            todo.extend(obj.__defaults__ or ())
        elif isinstance(obj, type) and obj.__module__ == getattr(fn, "__module__", None):
            for member in vars(obj).values():
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                elif isinstance(member, property):
                    todo.extend(f for f in (member.fget, member.fset, member.fdel) if f is not None)
                    continue
                todo.append(member)
    return out


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # an empty cell: a name assigned later
        return False
    return True


def capture(fn: Any) -> SourceMap:
    """Collect, in the launching process, where ``fn``'s code and what it calls came from."""
    sources = SourceMap()
    if not callable(fn):
        return sources
    labels = _ipython_labels()
    sources.origin = origin_of(fn, labels)
    size = 0
    for func in _reachable_functions(fn):
        for code in _codes(func.__code__):
            filename = code.co_filename
            sources.files[_key(code)] = filename
            if filename in sources.lines or os.path.exists(filename):
                continue  # a worker on this host reads a real file itself
            lines = linecache.getlines(filename)
            if lines and size + sum(map(len, lines)) <= MAX_SOURCE_BYTES:
                sources.lines[filename] = lines
                size += sum(map(len, lines))
                if filename in labels:
                    sources.labels[filename] = f"Cell In[{labels[filename]}]"
    return sources


def origin_of(fn: Any, labels: dict[str, int]) -> str:
    """Where ``fn`` came from when its module is ``__main__`` (which names no file): the notebook
    the kernel runs (``$JPY_SESSION_NAME``, which Jupyter sets, or the ``__session__`` it gives
    the kernel's namespace) and the cell, or the script; "" when neither is known, or when
    ``fn``'s module names it already."""
    if getattr(fn, "__module__", None) != "__main__":
        return ""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "?")
    main = sys.modules.get("__main__")
    notebook = os.environ.get("JPY_SESSION_NAME") or getattr(main, "__session__", "")
    code = getattr(fn, "__code__", None)
    cell = labels.get(code.co_filename) if code is not None else None
    if isinstance(notebook, str) and notebook:
        return f"{_near(notebook)}:{name}" + (f" (Cell In[{cell}])" if cell is not None else "")
    if cell is not None:
        return f"Cell In[{cell}]:{name}"
    script = getattr(main, "__file__", None)
    return f"{_near(script)}:{name}" if isinstance(script, str) and script else ""


def cell_sources(source: str, filename: str, count: int | None) -> SourceMap:
    """Where a ``%%orch`` cell's code came from: its lines under ``filename`` (the name the
    ranks compile it with), labelled ``Cell In[count]`` in tracebacks, and its origin, the
    notebook and the cell (``analysis.ipynb (Cell In[3])``)."""
    sources = SourceMap()
    sources.lines[filename] = source.splitlines(True)
    if count is not None:
        sources.labels[filename] = f"Cell In[{count}]"
        main = sys.modules.get("__main__")
        notebook = os.environ.get("JPY_SESSION_NAME") or getattr(main, "__session__", "")
        where = f"Cell In[{count}]"
        sources.origin = f"{_near(notebook)} ({where})" if isinstance(notebook, str) and notebook else where
    return sources


def running_cell() -> int | None:
    """The execution count of the notebook cell running now (``In[n]``), read from the cell's
    own frame: IPython counts the next cell (``execution_count``) while one runs."""
    labels = _ipython_labels()
    frame = sys._getframe(1)
    while frame is not None:
        count = labels.get(frame.f_code.co_filename)
        if count is not None:
            return count
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _near(path: str) -> str:
    """``path`` relative to the current folder when it is under it."""
    with contextlib.suppress(ValueError):
        relative = os.path.relpath(path)
        if not relative.startswith(".."):
            return relative
    return path


def _ipython_labels() -> dict[str, int]:
    """IPython's map from a cell's file name to its execution count, when a kernel runs here."""
    shell_module = sys.modules.get("IPython")
    if shell_module is None:
        return {}
    with contextlib.suppress(Exception):
        shell = shell_module.get_ipython()
        if shell is not None:
            return dict(getattr(shell.compile, "_filename_map", {}))
    return {}


def install(fn: Any, sources: SourceMap) -> None:
    """In a worker: give ``fn``'s code (and what it reaches) back its file names and source."""
    if not sources:
        return
    for filename, lines in sources.lines.items():
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)  # never evicted
    for func in _reachable_functions(fn):
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            func.__code__ = _renamed(func.__code__, sources.files)


def _renamed(code: types.CodeType, files: dict[CodeKey, str]) -> types.CodeType:
    consts = tuple(_renamed(c, files) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    filename = files.get(_key(code), code.co_filename)
    if filename == code.co_filename and consts == code.co_consts:
        return code
    return code.replace(co_filename=filename, co_consts=consts)


def label_cells(text: str, sources: SourceMap) -> str:
    """A formatted traceback with each cell's frames as IPython writes them: ``Cell In[2], line 17``."""
    for filename, label in sources.labels.items():
        text = re.sub(rf'File "{re.escape(filename)}", line', f"{label}, line", text)
    return text
