"""Reading a dead worker's fatal-error dump back as its failure (a unit: text in, text out)."""

from __future__ import annotations

from orch.runtime.fatal import explain, read_dump
from orch.runtime.source import SourceMap

CELL = "/tmp/ipykernel_7/3841.py"
SITE = "/opt/venv/lib/python3.11/site-packages"

# As a worker's log holds it: orch's records, gloo's last words, faulthandler's dump.
ABORT_LOG = f"""\
2026-01-02 10:00:00,001 r-w0 INFO rank 0: process group up (gloo, rendezvous 127.0.0.1:29500); training on cpu
terminate called after throwing an instance of 'gloo::EnforceNotMet'
  what():  [enforce fail at gloo/transport/tcp/pair.cc:456] op.preamble.length <= op.nbytes. 24 vs 4. \
Received data size doesn't match expected size. Is there a distributed collective mismatch in your code?
Exception raised from handleRead at gloo/transport/tcp/pair.cc:456 (most recent call first):
frame #0: c10::detail::torchCheckFail + 0x4c
Fatal Python error: Aborted

Thread 0x00007f6fb1ffb6c0 (most recent call first):
  File "{SITE}/grpc/_channel.py", line 1176 in _blocking
  File "/repo/orch/wire/auth.py", line 88 in intercept_unary_unary
  File "/repo/orch/runtime/_sender.py", line 121 in _loop

Thread 0x00007f6ff5fceb80 (most recent call first):
  File "{SITE}/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "{SITE}/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "{CELL}", line 15 in train
  File "/repo/orch/runtime/worker.py", line 417 in run_worker
  File "/repo/orch/runtime/worker.py", line 480 in spawn_main
  File "/usr/lib/python3.11/multiprocessing/forkserver.py", line 313 in _serve_one

Extension modules: numpy._core._multiarray_umath, torch._C, grpc._cython.cygrpc (total: 3)
"""


def _cell_sources() -> SourceMap:
    lines = [f"# line {n}\n" for n in range(1, 15)] + ["        dist.all_reduce(total)\n"]
    return SourceMap(files={("train", 1, b"")}, lines={CELL: lines}, labels={CELL: "Cell In[3]"})  # type: ignore[arg-type]


def test_an_abort_in_a_collective_reads_as_the_training_thread_and_the_library_s_words() -> None:
    explained = explain(ABORT_LOG, _cell_sources(), "logs/r-w0.log")
    assert explained is not None
    text, line = explained
    assert line == (
        "gloo::EnforceNotMet in all_reduce (Cell In[3], line 15, in train): [enforce fail at "
        "gloo/transport/tcp/pair.cc:456] op.preamble.length <= op.nbytes. 24 vs 4. Received data "
        "size doesn't match expected size. Is there a distributed collective mismatch in your code?"
    )
    shown = text.splitlines()
    assert shown[1:5] == [
        '  File "/repo/orch/runtime/worker.py", line 417, in run_worker',
        "  Cell In[3], line 15, in train",
        "    dist.all_reduce(total)",
        f'  File "{SITE}/torch/distributed/c10d_logger.py", line 83, in wrapper',
    ]
    # Only the training thread, none of orch's start-up below run_worker, no C++ frames,
    # no extension modules; the dump's whole text stays in the log, which is named.
    absent_parts = ("_sender.py", "intercept_unary_unary", "spawn_main", "frame #0", "Extension modules")
    absent_parts += (CELL,)
    for absent in absent_parts:
        assert absent not in text, absent
    assert "Is there a distributed collective mismatch in your code?" in text
    assert shown[-1] == "Fatal Python error: Aborted (every thread's stack is in logs/r-w0.log)"


def test_a_segfault_in_the_user_s_own_frame_names_that_frame() -> None:
    log = (
        "2026-01-02 10:00:00,001 r-w1 INFO rank 1: process group up\n"
        "Fatal Python error: Segmentation fault\n\n"
        "Current thread 0x00007f (most recent call first):\n"
        f'  File "{SITE}/ctypes/__init__.py", line 519 in string_at\n'
        '  File "/home/u/train.py", line 70 in crash\n'
        '  File "/repo/orch/runtime/worker.py", line 417 in run_worker\n'
    )
    explained = explain(log, SourceMap(), "logs/r-w1.log")
    assert explained is not None
    assert explained[1] == (
        "Fatal Python error: Segmentation fault in string_at (/home/u/train.py, line 70, in crash)"
    )


def test_a_log_without_a_dump_is_not_explained() -> None:
    assert read_dump("2026-01-02 10:00:00,001 r-w0 INFO rank 0: process group up\nKilled\n") is None
    assert explain("", SourceMap(), "logs/x.log") is None
