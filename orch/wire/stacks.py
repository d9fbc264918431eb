"""The ranks' stacks in words: one rank's stack as a traceback, and every rank's grouped by frame.

A rank's heartbeat thread takes its training thread's stack when the master asks for it (a run
that stopped progressing, a "Stacks" button, ``run.stacks()``, ``orch stacks``). Ranks of a DDP
group that hangs are mostly at the same place, waiting for the one that is not: so the stacks
are grouped by frames, each group summed up by the innermost line of the user's own code, and
the rank whose stack differs from the rest is named. The master writes the text; the panel,
the dashboard and ``orch status`` show it as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.model import Frame, Stack

FrameKey = tuple[tuple[str, int, str], ...]


def frame_location(frame: Frame) -> str:
    """Where a frame is, as a traceback says it: ``Cell In[3], line 12`` or ``File "x.py", line 4``."""
    if frame.file.startswith("Cell In["):
        return f"{frame.file}, line {frame.line}"
    return f'File "{frame.file}", line {frame.line}'


def format_stack(stack: Stack) -> str:
    """A stack as a traceback writes one, outermost frame first (with its note, if any)."""
    lines = [
        f"  {frame_location(f)}, in {f.function}" + (f"\n    {f.code}" if f.code else "")
        for f in stack.frames
    ]
    if stack.note:
        lines.append(f"  ({stack.note})" if stack.frames else stack.note)
    return "\n".join(lines)


def ranks_text(ranks: Sequence[int]) -> str:
    """``rank 3``, ``ranks 0-3``, ``ranks 0, 2, 3``: ranks as people write them."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def where(stack: Stack) -> str:
    """One line for a stack: the innermost line of the user's code, and the call it waits in.

    ``in `loss.backward()` (Cell In[3], line 12) → _engine_run_backward``; a stack without
    the user's code is summed up by its innermost frame.
    """
    if not stack.frames:
        return stack.note or "no stack"
    frames = list(stack.frames)
    users = [f for f in frames if f.user]
    top = users[-1] if users else frames[-1]
    code = f"`{top.code}`" if top.code else top.function
    text = f"in {code} ({_short(top.file)}, line {top.line})"
    inner = frames[-1]
    if inner is not top:
        text += f" → {inner.function}{WAITS.get(inner.function, '')}"
    return text


def _short(file: str) -> str:
    """A cell's label, or a file's name without its folders (the full stack has the path)."""
    return file if file.startswith("Cell In[") else file.replace("\\", "/").rsplit("/", 1)[-1]


# Python frames where the common waits show up, and what the C++ below them is doing.
WAITS = {
    "_engine_run_backward": " (the backward pass: DDP all-reduces the gradients in it)",
    "run_backward": " (the backward pass: DDP all-reduces the gradients in it)",
}


@dataclass
class Stacks:
    """Every rank's stack at one moment: ``str()`` of it is the grouped summary.

    ``by_rank`` holds each rank's stack as a traceback; ``missing`` the ranks that sent none
    (and why); ``odd`` the ranks whose stacks differ from the rest's.
    """

    by_rank: dict[int, str] = field(default_factory=dict)
    grouped: str = ""
    missing: dict[int, str] = field(default_factory=dict)
    odd: list[int] = field(default_factory=list)

    def __str__(self) -> str:
        return self.grouped or "no stacks: no rank is running"

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, printer: object, cycle: bool) -> None:
        printer.text(str(self))  # type: ignore[attr-defined]  # IPython's pretty printer


def group(stacks: Mapping[int, Stack], missing: Mapping[int, str] | None = None) -> Stacks:
    """Group ranks by the frames of their stacks: a summary line per group (the odd ranks out
    named), then each group's stack in full once."""
    missing = dict(missing or {})
    groups: dict[FrameKey, list[int]] = {}
    for rank in sorted(stacks):
        stack = stacks[rank]
        if not stack.frames:
            missing[rank] = stack.note or "it sent an empty stack"
            continue
        key = tuple((f.file, f.line, f.function) for f in stack.frames)
        groups.setdefault(key, []).append(rank)
    ordered = sorted(groups.values(), key=lambda ranks: (-len(ranks), ranks[0]))
    odd: list[int] = []
    if len(ordered) > 1 and len(ordered[0]) > len(ordered[1]):
        odd = sorted(r for ranks in ordered[1:] for r in ranks)  # the rest agree; these do not
    summary, bodies = [], []
    for ranks in ordered:
        stack = stacks[ranks[0]]
        label = ranks_text(ranks)
        flag = " (the odd one out)" if ranks[0] in odd and len(odd) == 1 else ""
        flag = flag or (" (differs from the rest)" if ranks[0] in odd else "")
        summary.append(f"{label}{flag}: {where(stack)}")
        bodies.append(f"-- {label} --\n{format_stack(stack)}")
    for rank, why in sorted(missing.items()):
        summary.append(f"rank {rank}: no stack ({why})")
    text = "\n".join(summary)
    if bodies:
        text += "\n\n" + "\n\n".join(bodies)
    return Stacks(
        by_rank={rank: format_stack(stack) for rank, stack in stacks.items() if stack.frames},
        grouped=text,
        missing=missing,
        odd=odd,
    )


def stacks_of(reply: pb.GetStacksResponse) -> Stacks:
    """A GetStacks reply as :class:`Stacks`."""
    return Stacks(
        by_rank={r.rank: r.text for r in reply.ranks},
        grouped=reply.grouped,
    )
