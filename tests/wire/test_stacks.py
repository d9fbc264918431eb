"""orch.wire.stacks: every rank's stack grouped by frame, the odd rank out named; and
orch.runtime._stack: a live thread's stack, taken from another thread."""

from __future__ import annotations

import threading
import time

from orch.runtime._stack import capture, is_user_code
from orch.runtime.source import SourceMap
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.stacks import format_stack, group, ranks_text


def stack(*frames: tuple[str, int, str, str, bool]) -> pb.Stack:
    return pb.Stack(
        frames=[pb.Frame(file=f, line=n, function=fn, code=c, user=u) for f, n, fn, c, u in frames]
    )


WAIT = (
    "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py",
    2800,
    "all_reduce",
    "work.wait()",
    False,
)


def test_ranks_are_written_as_people_write_them() -> None:
    assert ranks_text([3]) == "rank 3"
    assert ranks_text([3, 1, 0, 2]) == "ranks 0-3"
    assert ranks_text([0, 1]) == "ranks 0, 1"
    assert ranks_text([0, 2, 3]) == "ranks 0, 2, 3"


def test_a_stack_reads_as_a_traceback_with_cells_labelled_as_ipython_labels_them() -> None:
    text = format_stack(stack(("Cell In[3]", 12, "train", "loss.backward()", True), WAIT))
    assert text.splitlines() == [
        "  Cell In[3], line 12, in train",
        "    loss.backward()",
        f'  File "{WAIT[0]}", line 2800, in all_reduce',
        "    work.wait()",
    ]


def test_the_odd_rank_out_is_named_and_each_group_shown_once() -> None:
    waiting = stack(("Cell In[3]", 12, "train", "dist.all_reduce(t)", True), WAIT)
    odd = stack(("Cell In[3]", 10, "train", "time.sleep(10**6)", True))
    grouped = group({0: waiting, 1: odd, 2: waiting, 3: waiting})
    lines = str(grouped).splitlines()
    assert lines[:2] == [
        "ranks 0, 2, 3: in `dist.all_reduce(t)` (Cell In[3], line 12) → all_reduce",
        "rank 1 (the odd one out): in `time.sleep(10**6)` (Cell In[3], line 10)",
    ]
    assert str(grouped).count("-- ranks 0, 2, 3 --") == 1 and str(grouped).count("time.sleep") == 2
    assert grouped.odd == [1]
    assert set(grouped.by_rank) == {0, 1, 2, 3}


def test_no_rank_is_odd_when_no_group_is_the_larger() -> None:
    a = stack(("x.py", 1, "f", "a()", True))
    b = stack(("x.py", 2, "f", "b()", True))
    grouped = group({0: a, 1: b})
    assert grouped.odd == []
    assert "odd" not in str(grouped)
    assert "differs" not in str(grouped)


def test_ranks_without_a_stack_are_named_with_why() -> None:
    grouped = group(
        {0: stack(("x.py", 1, "f", "a()", True)), 2: pb.Stack(note="the training thread has ended")},
        {1: "it did not answer in time"},
    )
    assert "rank 1: no stack (it did not answer in time)" in str(grouped)
    assert "rank 2: no stack (the training thread has ended)" in str(grouped)


def test_a_live_threads_stack_is_taken_from_another_thread_with_its_user_frames_marked(
    tmp_path: object,
) -> None:
    started, release = threading.Event(), threading.Event()

    def blocked_in_user_code() -> None:
        started.set()
        release.wait(30)

    thread = threading.Thread(target=blocked_in_user_code)
    thread.start()
    try:
        started.wait(5)
        time.sleep(0.05)
        assert thread.ident is not None
        taken = capture(thread.ident, SourceMap(labels={__file__: "Cell In[7]"}), step=41)
    finally:
        release.set()
        thread.join()
    assert taken.step == 41 and taken.taken > 0
    ours = [f for f in taken.frames if f.function == "blocked_in_user_code"]
    assert len(ours) == 1 and ours[0].user and ours[0].file == "Cell In[7]"
    assert ours[0].code == "release.wait(30)"
    inner = taken.frames[-1]
    assert inner.function == "wait" and not inner.user  # threading's own frame: Python's, not the user's
    assert not is_user_code(threading.__file__)


def test_a_thread_that_ended_has_no_stack() -> None:
    assert capture(-1, None, 0).note == "the training thread has ended"
