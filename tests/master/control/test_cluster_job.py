"""orch.master.control.cluster_job: the scheduler's job of a run, and when its news is an event."""

from __future__ import annotations

from orch.master.control.cluster_job import JobWatch
from orch.wire.model import JobView


def job(state: str, reason: str = "", nodes: str = "") -> JobView:
    return JobView("slurm", "42", state, reason, nodes)


def test_no_job_until_the_scheduler_says_one() -> None:
    assert JobWatch().job is None


def test_the_first_word_and_every_change_are_news_the_same_word_again_is_not() -> None:
    watch = JobWatch()
    assert watch.update(job("PENDING", "Priority")) == "slurm job 42 PENDING (Priority)"
    assert watch.update(job("PENDING", "Priority")) is None  # squeue every few seconds: no news
    assert watch.update(job("PENDING", "Resources")) == "slurm job 42 PENDING (Resources)"
    assert watch.update(job("RUNNING", "None", "n[1-2]")) == "slurm job 42 RUNNING on n[1-2]"
    assert watch.update(job("RUNNING", "None", "n[1-3]")) == "slurm job 42 RUNNING on n[1-3]"
    assert watch.update(job("COMPLETED", "", "n[1-3]")) == "slurm job 42 COMPLETED on n[1-3]"


def test_the_latest_word_is_kept_even_when_it_is_no_news() -> None:
    watch = JobWatch()
    watch.update(job("RUNNING", nodes="n1"))
    same = job("RUNNING", nodes="n1")
    assert watch.update(same) is None and watch.job is same


def test_squeues_none_reason_is_not_shown() -> None:
    assert JobWatch().update(job("PENDING", "None")) == "slurm job 42 PENDING"
