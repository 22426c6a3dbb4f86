"""Task schedulers: warm-up, gradient allocation by weight and improvement, stopping rules, determinism."""

from __future__ import annotations

import math

import pytest

from relay_tune.tuning import (
    ErrorKind,
    GradientScheduler,
    MeasureResult,
    RoundRobinScheduler,
    TaskProgress,
    TaskScheduler,
    TuningRecord,
)
from search_space import Config

ROUND = 4


def ok(cost: float) -> MeasureResult:
    return MeasureResult((cost,))


def failed() -> MeasureResult:
    return MeasureResult(None, ErrorKind.RUNTIME_ERROR, "crash")


def simulate(scheduler: TaskScheduler, curves: list[list[float | None]], weights: list[float], budget: int
             ) -> tuple[list[int], list[TaskProgress]]:
    """Run rounds: task i's j-th trial costs curves[i][j] (None: a failure). Returns the picked task per round."""
    progress = [TaskProgress(i, w) for i, w in enumerate(weights)]
    picks: list[int] = []
    spent = 0
    while spent < budget:
        index = scheduler.next_task(progress)
        if index is None:
            break
        picks.append(index)
        state = progress[index]
        for _ in range(ROUND):
            curve = curves[index]
            cost = curve[min(state.trials, len(curve) - 1)]
            state.observe(ok(cost) if cost is not None else failed())
            spent += 1
        state.end_round()
        reason = scheduler.stop_reason(state)
        if reason is not None:
            state.stopped = reason
    return picks, progress


def improving(start: float, rate: float, n: int = 400) -> list[float | None]:
    return [start * (rate ** i) for i in range(n)]


def test_every_task_gets_a_warm_up_round_first() -> None:
    curves = [improving(1.0, 0.99), improving(1.0, 0.99), improving(1.0, 0.99)]
    picks, _ = simulate(GradientScheduler(), curves, [1, 5, 2], budget=3 * ROUND)
    assert picks == [0, 1, 2]


def test_heavier_and_slower_tasks_get_more_rounds() -> None:
    curves = [improving(1e-3, 0.97), improving(1e-3, 0.97)]
    picks, _ = simulate(GradientScheduler(), curves, [10, 1], budget=40 * ROUND)
    assert picks.count(0) > 2 * picks.count(1)
    picks, _ = simulate(GradientScheduler(), [improving(8e-3, 0.97), improving(1e-3, 0.97)], [1, 1], 40 * ROUND)
    assert picks.count(0) > 2 * picks.count(1)


def test_recent_improvement_raises_a_tasks_priority() -> None:
    scheduler = GradientScheduler(alpha=0.5, window=3)
    stalled = TaskProgress(0, 1.0, best_history=[1e-3, 1e-3, 1e-3, 1e-3, 1e-3])
    improving_now = TaskProgress(1, 1.0, best_history=[4e-3, 3e-3, 2e-3, 1.5e-3, 1e-3])
    assert scheduler.score(improving_now) > scheduler.score(stalled)
    assert scheduler.next_task([stalled, improving_now]) == 1


def test_early_stopping_ends_tasks_without_improvement() -> None:
    flat: list[float | None] = [1e-3] * 400
    scheduler = GradientScheduler(early_stopping=3 * ROUND)
    picks, progress = simulate(scheduler, [flat, improving(1e-3, 0.95)], [1, 1], budget=100 * ROUND)
    assert progress[0].stopped is not None and "no improvement" in progress[0].stopped
    assert picks.count(0) <= 4
    assert progress[1].live or "no improvement" in str(progress[1].stopped)


def test_consecutive_failures_stop_a_task_and_failing_tasks_come_first() -> None:
    scheduler = GradientScheduler(max_consecutive_failures=3 * ROUND)
    picks, progress = simulate(scheduler, [[None], improving(1e-3, 0.99)], [1, 1], budget=30 * ROUND)
    assert progress[0].stopped is not None and "consecutive failed" in progress[0].stopped
    assert picks[:4] == [0, 1, 0, 0]  # no kernel yet is the most urgent, until the failure limit
    assert picks.count(0) == 3


def test_per_task_limit_and_allowance() -> None:
    scheduler = RoundRobinScheduler(max_trials_per_task=2 * ROUND)
    picks, progress = simulate(scheduler, [improving(1.0, 0.9)] * 2, [1, 1], budget=100 * ROUND)
    assert picks == [0, 1, 0, 1]
    assert all("per-task limit" in str(p.stopped) for p in progress)
    assert scheduler.allowance(TaskProgress(0, 1.0, trials=3)) == 2 * ROUND - 3
    assert GradientScheduler().allowance(TaskProgress(0, 1.0)) is None


def test_round_robin_alternates() -> None:
    picks, _ = simulate(RoundRobinScheduler(), [improving(1.0, 0.9)] * 3, [1, 9, 1], budget=9 * ROUND)
    assert picks == [0, 1, 2] * 3


def test_gradient_scheduling_is_deterministic_with_a_seed() -> None:
    curves: list[list[float | None]] = [[1e-3] * 400, [1e-3] * 400, [1e-3] * 400]  # all tied: only the seed decides
    first, _ = simulate(GradientScheduler(seed=7), curves, [1, 1, 1], budget=30 * ROUND)
    second, _ = simulate(GradientScheduler(seed=7), curves, [1, 1, 1], budget=30 * ROUND)
    assert first == second
    others = [simulate(GradientScheduler(seed=s), curves, [1, 1, 1], budget=30 * ROUND)[0] for s in range(5)]
    assert any(o != first for o in others)


def test_score_formula() -> None:
    scheduler = GradientScheduler(alpha=0.5, window=2)
    progress = TaskProgress(0, weight=3.0, best_history=[8.0, 6.0, 5.0, 2.0])
    backward = (6.0 - 2.0) / 2
    forward = 2.0 / 4
    assert scheduler.score(progress) == pytest.approx(3.0 * (0.5 * backward + 0.5 * forward))
    assert math.isinf(scheduler.score(TaskProgress(1, 1.0, best_history=[None])))


def test_progress_is_rebuilt_from_records() -> None:
    costs = [5.0, None, 3.0, 4.0, 2.0, None, None]
    records = [TuningRecord("k", "llvm", Config({"i": i}), () if c is None else (c,),
                            None if c is not None else ErrorKind.TIMEOUT) for i, c in enumerate(costs)]
    progress = TaskProgress.from_records(0, 2.0, records, round_size=3)
    assert (progress.trials, progress.valid_trials, progress.best_cost) == (7, 4, 2.0)
    assert progress.best_history == [3.0, 2.0, 2.0]
    assert progress.consecutive_failures == 2
    assert progress.trials_since_improvement == 2


# ---------------------------------------------------------------------------------------------------------------
# Round-robin, short warm-up rounds, the scheduler the tuner is given by name
# ---------------------------------------------------------------------------------------------------------------


def test_round_robin_ignores_weights_and_improvement() -> None:
    # the gradient scheduler sends most rounds to the heavy, improving task; round-robin shares them evenly
    curves = [improving(1e-3, 0.95), [1e-3] * 400, [1e-3] * 400]
    picks, _ = simulate(RoundRobinScheduler(), curves, [20, 1, 1], budget=30 * ROUND)
    assert [picks.count(i) for i in range(3)] == [10, 10, 10]
    assert picks[:6] == [0, 1, 2, 0, 1, 2]
    gradient, _ = simulate(GradientScheduler(), curves, [20, 1, 1], budget=30 * ROUND)
    assert gradient.count(0) > 12  # round-robin: 10


def test_round_robin_skips_stopped_tasks() -> None:
    scheduler = RoundRobinScheduler(max_consecutive_failures=2 * ROUND)
    picks, progress = simulate(scheduler, [[None], improving(1.0, 0.9), improving(1.0, 0.9)], [1, 1, 1],
                               budget=12 * ROUND)
    assert progress[0].stopped is not None
    assert picks.count(0) == 2 and picks[6:] == [1, 2] * 3


def test_short_warm_up_round_and_then_the_objective_decides() -> None:
    scheduler = GradientScheduler(warmup_trials=1)
    fresh = TaskProgress(0, 1.0)
    assert scheduler.allowance(fresh) == 1
    assert scheduler.allowance(TaskProgress(0, 1.0, trials=1, best_history=[1e-3])) is None
    assert GradientScheduler(warmup_trials=1, max_trials_per_task=5).allowance(TaskProgress(0, 1.0, trials=5)) == 0
    assert RoundRobinScheduler(warmup_trials=2).allowance(fresh) == 2
    with pytest.raises(ValueError, match="warmup_trials"):
        GradientScheduler(warmup_trials=0)

    # With one-trial warm-ups, tasks holding 1% of the estimated latency each wait while the heavy one improves;
    # a full warm-up round spends a whole batch on each of them first.
    def heavy_share(scheduler: GradientScheduler, budget: int) -> tuple[list[int], list[TaskProgress]]:
        progress = [TaskProgress(i, w) for i, w in enumerate([1.0] + [0.01] * 9)]
        picks: list[int] = []
        while sum(p.trials for p in progress) < budget:
            index = scheduler.next_task(progress)
            assert index is not None
            picks.append(index)
            state = progress[index]
            for _ in range(min(ROUND, scheduler.allowance(state) or ROUND)):
                state.observe(ok(1e-3 * 0.97 ** state.trials))
            state.end_round()
        return picks, progress

    picks, progress = heavy_share(GradientScheduler(warmup_trials=1), 30 * ROUND)
    assert picks[:10] == list(range(10))  # the warm-up: one trial each
    assert picks[10:20] == [0] * 10
    _, full = heavy_share(GradientScheduler(), 30 * ROUND)
    assert sum(p.trials for p in full[1:]) >= 9 * ROUND
    assert progress[0].trials > full[0].trials
    assert progress[0].best_cost is not None and full[0].best_cost is not None
    assert progress[0].best_cost < full[0].best_cost


def test_the_tuner_takes_a_scheduler_by_name() -> None:
    from relay_tune import cli
    from relay_tune.errors import RelayTuneError
    from relay_tune.tuning.tune_model import SCHEDULERS, DeadlineScheduler, make_scheduler

    assert cli.SCHEDULERS == SCHEDULERS  # the command line's copy (it does not import the tuner)
    assert isinstance(make_scheduler("round-robin"), RoundRobinScheduler)
    gradient = make_scheduler("gradient", seed=3, early_stopping=5, warmup_trials=1)
    assert isinstance(gradient, GradientScheduler) and gradient.early_stopping == 5
    with pytest.raises(RelayTuneError, match="unknown task scheduler 'fifo'; choose one of gradient, round-robin"):
        make_scheduler("fifo")

    # the deadline wrapper keeps the inner scheduler's choices, limits and stopping rules
    wrapped = DeadlineScheduler(None, RoundRobinScheduler(max_trials_per_task=2 * ROUND, warmup_trials=1))
    picks, _ = simulate(wrapped, [improving(1.0, 0.9)] * 2, [9, 1], budget=100 * ROUND)
    assert picks == [0, 1, 0, 1]
    assert wrapped.allowance(TaskProgress(0, 1.0)) == 1
    expired = DeadlineScheduler(0.0, RoundRobinScheduler())
    assert expired.next_task([TaskProgress(0, 1.0)]) is None and expired.expired
