"""What a worker that died of a fatal error left in its log, read back as its failure.

A rank that aborts in native code (gloo's or NCCL's ``std::terminate`` on a collective
mismatch, a segfault) reports nothing itself: the launcher reads its log. There the native
library wrote its explanation (``what():  ... Is there a distributed collective mismatch in
your code?``), then faulthandler its dump: ``Fatal Python error: Aborted``, every thread's
stack, most recent call first, and a list of the interpreter's extension modules. Its last
lines start in whichever thread came last (often orch's own heartbeat thread) and end in that
list. :func:`explain` turns it into what a traceback would have said: the training thread's
stack only, oldest frame first, with notebook cells labelled as IPython labels them
(``Cell In[3], line 15``) and their source lines; then the library's explanation; and one
line that says what failed where. The whole dump stays in the log.

    <log records>                                  Traceback of the training thread ...:
    terminate called after ... 'gloo::EnforceNotMet'   File ".../worker.py", line 417, in run_worker
      what():  [...] collective mismatch ...?            fn(ctx)
    Fatal Python error: Aborted                ──►   Cell In[3], line 15, in train
    Thread 0x.. (most recent call first):              dist.all_reduce(total)
      File ".../_sender.py", line 121 in _loop       File ".../distributed_c10d.py", ... in all_reduce
    Thread 0x.. (most recent call first):          terminate called after ... 'gloo::EnforceNotMet'
      File ".../c10d.py", line 3252 in all_reduce    what():  [...] collective mismatch ...?
      File "/tmp/ipykernel_7/12.py", line 15 in train  Fatal Python error: Aborted (...)
      File ".../worker.py", line 417 in run_worker
    Extension modules: numpy..., (total: 124)
"""

from __future__ import annotations

import linecache
import os
import re
import sysconfig
from dataclasses import dataclass, field

from orch.runtime.source import SourceMap, label_cells

# How much of a dead worker's log is read for its dump: every thread's stack fits.
MAX_BYTES = 256 * 1024
_FATAL = re.compile(r"^Fatal Python error: (.*)$")
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+.*\(most recent call first\):$")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>.*)$')
_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")  # a line of the worker's logging
_TERMINATE = re.compile(r"terminate called after throwing an instance of '(?P<type>[^']+)'")
_WHAT = re.compile(r"^\s*what\(\):\s*(?P<message>.*)$")
_NATIVE_FRAME = re.compile(r"^(frame #\d+:|Exception raised from )")  # c10's C++ stack
MAX_SAID = 12  # lines of the library's explanation kept
_ORCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PATHS = sysconfig.get_paths()
_LIBRARIES = tuple({os.path.realpath(p) + os.sep for p in (_PATHS["stdlib"], _PATHS["purelib"], _ORCH)})


@dataclass
class Frame:
    file: str
    line: int
    name: str


@dataclass
class FatalDump:
    """faulthandler's dump in a log, read back."""

    error: str  # what faulthandler named: "Aborted", "Segmentation fault"
    said: list[str] = field(default_factory=list)  # the lines before it: the library's explanation
    frames: list[Frame] = field(default_factory=list)  # the training thread's, oldest first


def read_dump(text: str) -> FatalDump | None:
    """The last fatal-error dump in ``text`` (a worker's log), or None when there is none."""
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if _FATAL.match(ln)]
    if not starts:
        return None
    start = starts[-1]
    match = _FATAL.match(lines[start])
    assert match is not None
    dump = FatalDump(match.group(1).strip(), said=_said(lines[:start]))
    threads: list[tuple[bool, list[Frame]]] = []
    for ln in lines[start + 1 :]:
        head = _THREAD.match(ln)
        if head:
            threads.append((head.group(1) == "Current thread", []))
            continue
        frame = _FRAME.match(ln)
        if frame and threads:
            threads[-1][1].append(Frame(frame["file"], int(frame["line"]), frame["name"]))
    dump.frames = _training_thread(threads)
    return dump


def _said(before: list[str]) -> list[str]:
    """What was written just before the dump, after the worker's last log record."""
    said: list[str] = []
    for ln in reversed(before):
        if _RECORD.match(ln) or len(said) >= MAX_SAID:
            break
        if ln.strip() and not _NATIVE_FRAME.match(ln):
            said.append(ln.rstrip())
    return said[::-1]


def _training_thread(threads: list[tuple[bool, list[Frame]]]) -> list[Frame]:
    """The stack of the thread that ran the training function (the one in ``run_worker``),
    oldest frame first, from ``run_worker`` on (the frames below it are orch's start-up)."""
    for _, frames in threads:
        names = [f.name for f in frames]
        if "run_worker" in names:
            return frames[: names.index("run_worker") + 1][::-1]
    for current, frames in threads:
        if current:
            return frames[::-1]
    return threads[0][1][::-1] if threads else []


def _user_frame(frames: list[Frame], sources: SourceMap) -> Frame | None:
    """The innermost frame of the user's code: a notebook cell, or a file outside Python's
    library, the installed packages and orch."""
    for frame in reversed(frames):
        if frame.file in sources.labels:
            return frame
        path = os.path.realpath(frame.file) if os.path.isabs(frame.file) else frame.file
        installed = f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path
        if not frame.file.startswith("<") and not installed and not path.startswith(_LIBRARIES):
            return frame
    return None


def _where(frame: Frame, sources: SourceMap) -> str:
    """As a traceback names a frame, a cell's as IPython does: ``Cell In[3], line 15, in train``."""
    return label_cells(f'File "{frame.file}", line {frame.line}, in {frame.name}', sources)


def _place(frame: Frame, sources: SourceMap) -> str:
    """A frame within a line: ``Cell In[3], line 15, in train``, ``/a/b.py, line 15, in train``."""
    return f"{sources.labels.get(frame.file, frame.file)}, line {frame.line}, in {frame.name}"


def _source_line(frame: Frame, sources: SourceMap) -> str:
    lines = sources.lines.get(frame.file)
    if lines is not None:
        return lines[frame.line - 1].strip() if 0 < frame.line <= len(lines) else ""
    return linecache.getline(frame.file, frame.line).strip()


def cause_line(dump: FatalDump, sources: SourceMap) -> str:
    """One line: what the library said (or faulthandler, when it said nothing) and where."""
    thrown, what = "", ""
    for ln in dump.said:
        if m := _TERMINATE.search(ln):
            thrown = m["type"]
        elif (m := _WHAT.match(ln)) and not what:
            what = m["message"].strip()
    head = thrown or f"Fatal Python error: {dump.error}"
    if dump.frames:
        op, user = dump.frames[-1], _user_frame(dump.frames, sources)
        if user is None or user is op:
            head += f" ({_place(op, sources)})"
        else:
            head += f" in {op.name} ({_place(user, sources)})"
    return f"{head}: {what}" if what else head


def explain(log_text: str, sources: SourceMap, log_name: str) -> tuple[str, str] | None:
    """A dead worker's failure from its log: (the text that stands for its traceback, its one
    line), or None when the log holds no fatal-error dump."""
    dump = read_dump(log_text)
    if dump is None:
        return None
    out = ["Traceback of the training thread, from faulthandler's dump (most recent call last):"]
    for frame in dump.frames:
        out.append(f"  {_where(frame, sources)}")
        if source := _source_line(frame, sources):
            out.append(f"    {source}")
    out.extend(dump.said)
    out.append(f"Fatal Python error: {dump.error} (every thread's stack is in {log_name})")
    return "\n".join(out), cause_line(dump, sources)
