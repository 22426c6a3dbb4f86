"""`Space`: ordered knobs plus constraints that reject invalid combinations before anything is built.

Constraints are named predicates over a whole `Config` (e.g. "the register tile fits in 32 vector registers").
They run before compilation, so an impossible schedule costs microseconds instead of a build. Spaces travel to
builder worker processes inside their tasks, so predicates must be picklable: module-level functions or
`functools.partial` of them, not lambdas.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from search_space.config import Config, InvalidConfigError
from search_space.knobs import Knob

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True)
class Constraint:
    """A named predicate: True when the config is allowed."""

    name: str
    predicate: Callable[[Config], bool]

    def __call__(self, config: Config) -> bool:
        return bool(self.predicate(config))


class Space:
    """The schedule search space of one task: knobs in definition order, and constraints."""

    def __init__(self, knobs: Sequence[Knob], constraints: Sequence[Constraint] = ()) -> None:
        names = [k.name for k in knobs]
        if len(set(names)) != len(names):
            raise ValueError(f"knob names must be unique, got {names}")
        params: list[str] = [p for k in knobs for p in k.param_names()]
        if len(set(params)) != len(params):
            raise ValueError(f"knobs map to clashing Optuna parameter names: {params}")
        self.knobs: tuple[Knob, ...] = tuple(knobs)
        self.constraints: tuple[Constraint, ...] = tuple(constraints)
        self._by_name = {k.name: k for k in self.knobs}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def knob(self, name: str) -> Knob:
        return self._by_name[name]

    # -- size and enumeration ------------------------------------------------------------------------------------

    def size(self) -> int:
        """Number of knob combinations before constraints (an upper bound on the number of valid configs)."""
        return math.prod(k.size() for k in self.knobs)

    def enumerate(self) -> Iterator[Config]:
        """Every valid config (constraints applied), in knob order. Only sensible for small spaces."""
        for values in itertools.product(*(k.values() for k in self.knobs)):
            config = Config(dict(zip(self.names, values)))
            if self._violated(config) is None:
                yield config

    def count_valid(self, limit: int = 1_000_000) -> int | None:
        """Exact number of valid configs, or None when the space is larger than `limit` to enumerate."""
        if self.size() > limit:
            return None
        if not self.constraints:
            return self.size()
        return sum(1 for _ in self.enumerate())

    # -- validity ------------------------------------------------------------------------------------------------

    def _violated(self, config: Config) -> str | None:
        for constraint in self.constraints:
            if not constraint(config):
                return constraint.name
        return None

    def validate(self, config: Config) -> None:
        """Raise `InvalidConfigError` naming the first problem: missing/unknown knobs, bad values, constraints."""
        missing = [n for n in self.names if n not in config]
        unknown = [n for n in config if n not in self._by_name]
        if missing or unknown:
            raise InvalidConfigError(f"config does not match the space: missing knobs {missing}, unknown {unknown}")
        for knob in self.knobs:
            knob.check(config[knob.name])
        violated = self._violated(config)
        if violated is not None:
            raise InvalidConfigError(f"config violates constraint {violated!r}: {config!r}")

    def is_valid(self, config: Config) -> bool:
        try:
            self.validate(config)
        except InvalidConfigError:
            return False
        return True

    # -- sampling and mutation -----------------------------------------------------------------------------------

    def sample(self, rng: np.random.Generator, max_attempts: int = 10_000) -> Config:
        """A random valid config (rejection sampling against the constraints)."""
        for _ in range(max_attempts):
            config = Config({k.name: k.sample(rng) for k in self.knobs})
            if self._violated(config) is None:
                return config
        raise InvalidConfigError(f"no valid config found in {max_attempts} samples: the constraints reject (almost) "
                                 f"everything in this space")

    def neighbors(self, config: Config, rng: np.random.Generator | None = None) -> list[Config]:
        """Valid configs that differ from `config` by one knob mutation; shuffled when `rng` is given."""
        self.validate(config)
        found: list[Config] = []
        for knob in self.knobs:
            for value in knob.neighbors(config[knob.name]):
                candidate = config.replace(**{knob.name: value})
                if self._violated(candidate) is None:
                    found.append(candidate)
        if rng is not None:
            order = rng.permutation(len(found))
            found = [found[i] for i in order]
        return found

    def mutate(self, config: Config, rng: np.random.Generator) -> Config | None:
        """One random valid neighbour, or None when `config` has none."""
        found = self.neighbors(config)
        if not found:
            return None
        return found[int(rng.integers(len(found)))]

    # -- Optuna --------------------------------------------------------------------------------------------------

    def to_optuna(self, trial: optuna.trial.BaseTrial) -> Config:
        """Suggest every knob on an Optuna trial. The result satisfies every knob; check constraints separately."""
        return Config({k.name: k.suggest(trial) for k in self.knobs})

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return {p: d for k in self.knobs for p, d in k.distributions().items()}

    def to_params(self, config: Config) -> dict[str, Any]:
        """Optuna parameters that `to_optuna` maps back to `config` (to import measured configs into a study)."""
        self.validate(config)
        return {p: v for k in self.knobs for p, v in k.to_params(config[k.name]).items()}

    def __repr__(self) -> str:
        constraints = [c.name for c in self.constraints]
        return f"Space(knobs={list(self.knobs)!r}, constraints={constraints!r}, size={self.size()})"
