"""The live progress line of `relay-tune MODEL`: the estimated end-to-end latency and how much it improved."""

from __future__ import annotations

import io

from rich.console import Console

from relay_tune.tuning.progress import TaskInfo
from relay_tune.tuning.tune_model import RichProgress


def test_status_shows_the_estimated_latency_and_its_improvement() -> None:
    progress = RichProgress(Console(file=io.StringIO()))
    progress._tasks = (TaskInfo(0, "k0", "dense 1x8", 1, 1e6, 10), TaskInfo(1, "k1", "conv2d 1x3", 2, 1e6, 10))
    partial = progress._status(0, 1.0, 2e-3, 1)
    assert "est. model 2.000 ms (+1 untimed)" in partial and "faster" not in partial
    first = progress._status(1, 1.0, 4e-3, 0)  # every task timed: the reference for what follows
    assert "est. model 4.000 ms" in first and "faster" not in first
    later = progress._status(1, 2.0, 2.5e-3, 0)
    assert "est. model 2.500 ms (1.60x faster)" in later
