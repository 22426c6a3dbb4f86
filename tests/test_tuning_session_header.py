"""The log's session header names the task scheduler that shares the budget, and the deadline wrapper if any."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from relay_tune.tuning import read_events, tune
from relay_tune.tuning.simulated import SimulatedBuilder, SleepRunner, simulated_tasks
from relay_tune.tuning.tune_model import DeadlineScheduler, make_scheduler


@pytest.mark.parametrize(("name", "deadline", "expected"), [
    ("gradient", None, "GradientScheduler"),
    ("round-robin", None, "RoundRobinScheduler"),
    ("round-robin", 3600.0, "DeadlineScheduler(RoundRobinScheduler)"),
    ("gradient", 3600.0, "DeadlineScheduler(GradientScheduler)"),
])
def test_the_session_header_names_the_scheduler_used(tmp_path: Path, name: str, deadline: float | None,
                                                     expected: str) -> None:
    scheduler = DeadlineScheduler(None if deadline is None else time.monotonic() + deadline, make_scheduler(name))
    log = tmp_path / "log.jsonl"
    tune(simulated_tasks(), 4, log, storage=None, builder=SimulatedBuilder(), runner=SleepRunner(0.0),
         scheduler=scheduler, batch_size=2)
    (start,) = [e for e in read_events(log) if e.event == "session_start"]
    assert start.data["scheduler"] == expected
