"""Search spaces: knob kinds, constraints, configs and their Optuna encodings."""

from __future__ import annotations

import functools
import hashlib
import math
import pickle

import numpy as np
import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from search_space import (
    BoolKnob,
    ChoiceKnob,
    Config,
    Constraint,
    IntKnob,
    InvalidConfigError,
    Space,
    SplitKnob,
    config_key,
    split_candidates,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


# ---------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------


def test_config_key_is_the_digest_of_canonical_json() -> None:
    config = Config({"b": [2, 3], "a": "x"})
    canonical = '{"a":"x","b":[2,3]}'
    assert config.canonical_json == canonical
    assert config.key == hashlib.sha256(canonical.encode()).hexdigest()[:20]
    assert config_key({"a": "x", "b": (2, 3)}) == config.key


def test_config_is_frozen_hashable_and_normalises_lists() -> None:
    config = Config({"tile": [4, 8], "order": "ikj"})
    assert config["tile"] == (4, 8)
    assert config == Config({"order": "ikj", "tile": (4, 8)})
    assert len({config, Config({"tile": (4, 8), "order": "ikj"})}) == 1
    assert config.to_dict() == {"tile": [4, 8], "order": "ikj"}
    with pytest.raises(TypeError):
        config["tile"] = (1, 1)  # type: ignore[index]
    assert pickle.loads(pickle.dumps(config)) == config
    assert config.replace(order="ijk")["order"] == "ijk" and config["order"] == "ikj"


def test_config_distinguishes_bool_int_and_float() -> None:
    assert Config({"x": True}) != Config({"x": 1})
    assert Config({"x": 1}) != Config({"x": 1.0})
    assert Config({"x": np.int64(3)}) == Config({"x": 3})


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {"nested": 1}, object()])
def test_config_rejects_values_that_are_not_json(bad: object) -> None:
    with pytest.raises(InvalidConfigError):
        Config({"x": bad})


# ---------------------------------------------------------------------------------------------------------------
# Split knobs
# ---------------------------------------------------------------------------------------------------------------


def test_split_candidates_per_policy() -> None:
    assert split_candidates(12, "factors") == (1, 2, 3, 4, 6, 12)
    assert split_candidates(12, "power2") == (1, 2, 4, 8)
    assert split_candidates(12, "verbose") == (1, 2, 3, 4, 6, 8, 12)
    assert split_candidates(12, "verbose", max_factor=4) == (1, 2, 3, 4)


def test_split_values_include_non_divisors_with_a_tail() -> None:
    knob = SplitKnob("t", 40, 2)
    values = list(knob.values())
    assert (3, 16) in values  # 16 does not divide 40: ceil(40 / 16) = 3 outer iterations, the last one partial
    assert (40, 1) in values and (1, 40) in values
    assert all(outer == math.ceil(40 / inner) for outer, inner in values)
    with pytest.raises(InvalidConfigError, match="outer factor"):
        knob.check((2, 16))
    with pytest.raises(InvalidConfigError, match="not a candidate"):
        knob.check((4, 12))


def test_factors_policy_only_has_exact_tilings() -> None:
    knob = SplitKnob("t", 24, 3, policy="factors")
    for value in knob.values():
        assert math.prod(value) == 24
    assert not knob.contains((1, 16, 2))


@settings(max_examples=60, deadline=None)
@given(
    extent=st.integers(1, 300),
    levels=st.integers(2, 4),
    policy=st.sampled_from(["factors", "power2", "verbose"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_split_size_sampling_optuna_and_neighbors_agree(extent: int, levels: int, policy: str, seed: int) -> None:
    knob = SplitKnob("t", extent, levels, policy=policy)  # type: ignore[arg-type]
    values = list(knob.values())
    assert knob.size() == len(values) == len(set(values))
    rng = np.random.default_rng(seed)
    value = knob.sample(rng)
    assert knob.contains(value)
    # Optuna parameters map back to the same split.
    assert knob.suggest(optuna.trial.FixedTrial(knob.to_params(value))) == value
    for neighbor in knob.neighbors(value):
        assert knob.contains(neighbor) and neighbor != value
    # Any index combination Optuna can produce is clamped to a legal split.
    indices = {p: int(rng.integers(d.low, d.high + 1)) for p, d in knob.distributions().items()}  # type: ignore[attr-defined]
    assert knob.contains(knob.suggest(optuna.trial.FixedTrial(indices)))


# ---------------------------------------------------------------------------------------------------------------
# Other knobs
# ---------------------------------------------------------------------------------------------------------------


def test_choice_knob_with_structured_values_uses_indices_for_optuna() -> None:
    knob = ChoiceKnob("order", [("i", "j", "k"), ("i", "k", "j")])
    (distribution,) = knob.distributions().values()
    assert distribution.choices == (0, 1)  # type: ignore[attr-defined]
    assert knob.to_params(("i", "k", "j")) == {"order": 1}
    assert knob.suggest(optuna.trial.FixedTrial({"order": 1})) == ("i", "k", "j")
    assert knob.neighbors(("i", "j", "k")) == [("i", "k", "j")]


def test_choice_knob_with_strings_uses_values_for_optuna() -> None:
    knob = ChoiceKnob("layout", ["NCHW", "NHWC"])
    assert knob.to_params("NHWC") == {"layout": "NHWC"}
    with pytest.raises(InvalidConfigError):
        knob.check("NCHWc")
    with pytest.raises(ValueError):
        ChoiceKnob("dup", [1, 1])


def test_choice_knob_keeps_bool_and_int_apart() -> None:
    knob = ChoiceKnob("x", [1, True])
    assert knob.contains(True) and knob.contains(1) and not knob.contains(0)
    assert knob.suggest(optuna.trial.FixedTrial(knob.to_params(True))) is True


def test_int_knob_bounds_and_log_neighbors() -> None:
    knob = IntKnob("unroll", 1, 64, log=True)
    assert knob.size() == 64
    assert set(knob.neighbors(8)) == {7, 9, 4, 16}
    assert knob.neighbors(64) == [63, 32]
    with pytest.raises(InvalidConfigError):
        knob.check(65)
    with pytest.raises(InvalidConfigError):
        knob.check(True)
    rng = np.random.default_rng(0)
    assert all(1 <= knob.sample(rng) <= 64 for _ in range(200))  # type: ignore[operator]


def test_bool_knob() -> None:
    knob = BoolKnob("vec")
    assert list(knob.values()) == [False, True]
    assert knob.neighbors(True) == [False]
    assert not knob.contains(1)


# ---------------------------------------------------------------------------------------------------------------
# Spaces
# ---------------------------------------------------------------------------------------------------------------


def _tile_budget(config: Config, limit: int) -> bool:
    tile_x, tile_y = config["tile_x"], config["tile_y"]
    assert isinstance(tile_x, tuple) and isinstance(tile_y, tuple)
    return tile_x[-1] * tile_y[-1] <= limit


def _space(limit: int = 64) -> Space:
    return Space(
        [SplitKnob("tile_x", 32, 2), SplitKnob("tile_y", 24, 3), ChoiceKnob("order", ["xy", "yx"]),
         IntKnob("unroll", 0, 3), BoolKnob("vectorize")],
        [Constraint("tile_budget", functools.partial(_tile_budget, limit=limit))],
    )


def test_space_size_counts_combinations_and_count_valid_applies_constraints() -> None:
    space = _space()
    unconstrained = space.knob("tile_x").size() * space.knob("tile_y").size() * 2 * 4 * 2
    assert space.size() == unconstrained
    valid = space.count_valid()
    assert valid is not None and 0 < valid < unconstrained
    assert valid == sum(1 for _ in space.enumerate())
    assert space.count_valid(limit=10) is None


def test_space_validate_names_the_problem() -> None:
    space = _space()
    good = space.sample(np.random.default_rng(1))
    space.validate(good)
    with pytest.raises(InvalidConfigError, match="missing knobs"):
        space.validate(Config({"tile_x": (1, 32)}))
    with pytest.raises(InvalidConfigError, match="tile_budget"):
        space.validate(good.replace(tile_x=(1, 32), tile_y=(1, 1, 24)))
    with pytest.raises(InvalidConfigError, match="unroll"):
        space.validate(good.replace(unroll=9))


def test_sampling_and_neighbors_respect_constraints() -> None:
    space = _space(limit=16)
    rng = np.random.default_rng(7)
    for _ in range(200):
        config = space.sample(rng)
        assert space.is_valid(config)
        for neighbor in space.neighbors(config, rng):
            assert space.is_valid(neighbor)
            assert sum(neighbor[name] != config[name] for name in space.names) == 1
        mutated = space.mutate(config, rng)
        assert mutated is None or space.is_valid(mutated)


def _never(config: Config) -> bool:
    return False


def test_impossible_constraints_fail_loudly() -> None:
    space = Space([IntKnob("x", 0, 3)], [Constraint("never", _never)])
    assert space.count_valid() == 0
    with pytest.raises(InvalidConfigError, match="constraints reject"):
        space.sample(np.random.default_rng(0), max_attempts=50)


def test_optuna_round_trip_and_import_into_a_study() -> None:
    space = _space()
    config = space.sample(np.random.default_rng(3))
    params = space.to_params(config)
    assert space.to_optuna(optuna.trial.FixedTrial(params)) == config
    study = optuna.create_study()
    study.add_trial(optuna.trial.create_trial(params=params, distributions=space.distributions(), value=1.0))
    assert space.to_optuna(optuna.trial.FixedTrial(study.trials[0].params)) == config


def test_every_optuna_suggestion_satisfies_the_knobs() -> None:
    space = _space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(100):
        trial = study.ask()
        config = space.to_optuna(trial)
        for knob in space.knobs:
            assert knob.contains(config[knob.name])
        study.tell(trial, 1.0)


def test_tpe_finds_the_best_tile_of_a_synthetic_cost() -> None:
    # A cost with a unique optimum at tile_x inner = 8, tile_y inner factors (4, 2): TPE must get there.
    space = Space([SplitKnob("tile_x", 64, 2), SplitKnob("tile_y", 64, 3)])

    def cost(config: Config) -> float:
        tx, ty = config["tile_x"], config["tile_y"]
        assert isinstance(tx, tuple) and isinstance(ty, tuple)
        return abs(math.log2(tx[1] / 8)) + abs(math.log2(ty[1] / 4)) + abs(math.log2(ty[2] / 2))

    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, multivariate=True))
    best = math.inf
    for _ in range(80):
        trial = study.ask()
        value = cost(space.to_optuna(trial))
        best = min(best, value)
        study.tell(trial, value)
    assert best <= 1.0  # within one factor of two on one level


def test_spaces_reject_duplicate_names() -> None:
    with pytest.raises(ValueError, match="unique"):
        Space([IntKnob("a", 0, 1), BoolKnob("a")])
    with pytest.raises(ValueError, match="clashing"):
        Space([SplitKnob("t", 8, 2), IntKnob("t.1", 0, 1)])


def test_param_names_are_the_optuna_parameters_without_optuna() -> None:
    """`param_names` (what a space checks for clashes when it is made) names exactly `distributions`' keys."""
    knobs = [SplitKnob("t", 24, 3, policy="factors"), IntKnob("u", 1, 8), ChoiceKnob("c", ["a", "b"]),
             BoolKnob("b")]
    for knob in knobs:
        assert knob.param_names() == list(knob.distributions())
    with pytest.raises(ValueError, match="clashing"):
        Space([SplitKnob("t", 24, 3), IntKnob("t.1", 1, 4)])
