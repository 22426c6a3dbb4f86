"""The warm-up round's size in whole-model tuning (`tune_model.warmup_trials`): a full batch per task where the
warm-up rounds take at most half the budget, only the default schedule where they would take more (so the
gradient scheduler shares the rest by measured times), and the caller's choice (warm-up or batch size) always."""

from __future__ import annotations

import pytest

from relay_tune.tuning.tune_model import SearchOptions, batch_size_for, warmup_trials


@pytest.mark.parametrize(("trials", "tasks", "expected"), [
    (128, 5, None),   # the 2-layer LSTM: 5 x 8 = 40 warm-up trials of 128
    (64, 4, None),    # 4 x 8 = 32 of 64: exactly half
    (64, 5, 1),       # 5 x 8 = 40 of 64
    (128, 16, 1),     # a CRNN: 16 x 8 would be the whole budget
    (128, 60, 1),     # its int8 twin: 60 x 2 = 120 of 128
    (2000, 31, None),  # ResNet-50 at 2000 trials
])
def test_warmup_shrinks_to_the_default_where_full_batches_take_most_of_the_budget(
        trials: int, tasks: int, expected: int | None) -> None:
    search = SearchOptions()
    assert warmup_trials(search, trials, tasks) == expected
    assert 1 <= batch_size_for(search, trials, tasks) <= 8


def test_an_explicit_warmup_is_kept() -> None:
    assert warmup_trials(SearchOptions(warmup_trials=3), 128, 60) == 3
    assert warmup_trials(SearchOptions(batch_size=8), 128, 16) is None  # a batch size asked for: full rounds
