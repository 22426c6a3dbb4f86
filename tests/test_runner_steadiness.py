"""What keeps the runner's measurements steady: nothing of the tuning process runs on the cores while it times."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from relay_tune.tuning import LocalRunner
from relay_tune.tuning.testing import MatmulTask


def _blas_threads() -> list[int]:
    return [int(pool["num_threads"]) for pool in threadpool_info() if pool["user_api"] == "blas"]


class _ThreadRecordingMatmul(MatmulTask):
    """A matmul task whose reference notes how many threads numpy's BLAS may use while it runs."""

    seen: list[list[int]] = []

    def reference(self, inputs: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
        self.seen.append(_blas_threads())
        return super().reference(inputs)


def test_the_reference_runs_on_one_blas_thread() -> None:
    """After a multithreaded BLAS call its pool threads busy-wait for about 0.1 s, on the cores the kernel measured
    next runs on: a task's first measurement (right after its reference) then had repeats 1.5-3x apart
    (experiments/README.md, "Runner stability"). The runner computes references on one BLAS thread."""
    before = _blas_threads()
    if not before or max(before) < 2:
        pytest.skip("numpy's BLAS runs one thread here anyway")
    task = _ThreadRecordingMatmul(32, 48, 40)
    with LocalRunner(timeout=30.0, number=1, repeat=2, min_repeat_ms=1) as runner:
        result = runner.run(task, task.build(task.default_config()))
    assert result.error_kind is None, result.error_msg
    assert task.seen == [[1] * len(before)]
    assert _blas_threads() == before  # the process's own setting is back


def test_a_warm_up_time_runs_the_kernel_that_long_before_timing() -> None:
    task = MatmulTask(32, 48, 40)
    artifact = task.build(task.default_config())
    with LocalRunner(timeout=30.0, number=1, repeat=2, min_repeat_ms=1) as plain, \
            LocalRunner(timeout=30.0, number=1, repeat=2, min_repeat_ms=1, warmup_ms=300.0) as warmed:
        quick, slow = plain.run(task, artifact), warmed.run(task, artifact)
    assert quick.error_kind is None and slow.error_kind is None, (quick.error_msg, slow.error_msg)
    # a lower bound the warm-up guarantees (how long the plain run takes depends on the machine, so it is not compared)
    assert slow.run_seconds >= 0.3
