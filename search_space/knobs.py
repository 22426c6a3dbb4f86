"""Knob kinds: the dimensions of a schedule search space.

Each knob knows its legal values, how to sample one, how to ask Optuna for one (`suggest`) and how to describe a
known value as Optuna parameters (`to_params`/`distributions`, used to rebuild a study from a tuning log), and its
neighbours (single-step mutations, for model-guided local search).

Optuna encodings are chosen for TPE. Tile splits are the important case: a categorical over whole factor tuples
has no notion of "nearby" (TPE would learn each tuple separately), while independent per-level integers produce
many illegal products. So each inner level of a split is an *ordinal index into the sorted candidate factors*
(TPE's Parzen estimators exploit the order: neighbouring tile sizes perform alike), and an index that would
overflow the extent is clamped to the largest legal factor. Every suggestion is therefore legal; distinct indices
may map to the same split, which the search answers from the earlier measurement instead of measuring again.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from search_space.config import ConfigValue, InvalidConfigError, freeze_value

if TYPE_CHECKING:
    import optuna

SplitPolicy = Literal["factors", "power2", "verbose"]

# Split enumeration switches from a materialised list to level-by-level sampling above this many tuples.
_MAX_MATERIALISED_SPLITS = 200_000


class Knob(ABC):
    """One named dimension of a space. Values are frozen JSON-able data (see `search_space.config`)."""

    name: str

    @abstractmethod
    def size(self) -> int:
        """Number of legal values."""

    @abstractmethod
    def values(self) -> Iterator[ConfigValue]:
        """Every legal value, in a deterministic order."""

    @abstractmethod
    def sample(self, rng: np.random.Generator) -> ConfigValue:
        """A legal value drawn at random."""

    @abstractmethod
    def check(self, value: ConfigValue) -> None:
        """Raise `InvalidConfigError` saying why `value` is not legal for this knob."""

    @abstractmethod
    def suggest(self, trial: optuna.trial.BaseTrial) -> ConfigValue:
        """Ask an Optuna trial for a value (every answer is legal)."""

    @abstractmethod
    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        """The Optuna parameters this knob uses, by parameter name."""

    def param_names(self) -> list[str]:
        """The names of the Optuna parameters this knob uses (the keys of `distributions`, without Optuna)."""
        return [self.name]

    @abstractmethod
    def to_params(self, value: ConfigValue) -> dict[str, Any]:
        """Optuna parameter values that `suggest` maps back to `value` (for importing measured configs)."""

    @abstractmethod
    def neighbors(self, value: ConfigValue) -> list[ConfigValue]:
        """Legal values one mutation step away from `value` (never `value` itself)."""

    def contains(self, value: ConfigValue) -> bool:
        try:
            self.check(value)
        except InvalidConfigError:
            return False
        return True

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


# ---------------------------------------------------------------------------------------------------------------
# Tile splits
# ---------------------------------------------------------------------------------------------------------------


def split_candidates(extent: int, policy: SplitPolicy, max_factor: int | None = None) -> tuple[int, ...]:
    """Candidate factors for one inner split level: sorted, all <= extent (and <= max_factor)."""
    divisors = {d for i in range(1, math.isqrt(extent) + 1) if extent % i == 0 for d in (i, extent // i)}
    powers = {1 << p for p in range(extent.bit_length()) if (1 << p) <= extent}
    if policy == "factors":
        chosen = divisors
    elif policy == "power2":
        chosen = powers
    elif policy == "verbose":
        chosen = divisors | powers
    else:
        raise ValueError(f"unknown split policy {policy!r} (expected 'factors', 'power2' or 'verbose')")
    cap = extent if max_factor is None else min(extent, max_factor)
    return tuple(sorted(c for c in chosen if c <= cap))


class SplitKnob(Knob):
    """Multi-level tiling of one loop of length `extent` into `levels` nested loops.

    A value is a tuple of `levels` factors, outermost first: `(outer, f1, ..., f_inner)`. The inner factors come
    from the candidate set of `policy` ("factors": exact divisors; "power2": powers of two, tails allowed;
    "verbose": both, the default) and their product is at most `extent`; the outer factor is whatever remains,
    `ceil(extent / prod(inner))`, so non-divisor tiles leave a tail that the kernel must guard.
    """

    def __init__(
        self,
        name: str,
        extent: int,
        levels: int = 2,
        policy: SplitPolicy = "verbose",
        max_factor: int | None = None,
    ) -> None:
        if extent < 1:
            raise ValueError(f"split knob {name!r}: extent must be >= 1, got {extent}")
        if levels < 2:
            raise ValueError(f"split knob {name!r}: levels must be >= 2, got {levels}")
        self.name = name
        self.extent = extent
        self.levels = levels
        self.policy: SplitPolicy = policy
        self.max_factor = max_factor
        self._candidates = split_candidates(extent, policy, max_factor)
        self._index = {c: i for i, c in enumerate(self._candidates)}
        self._materialised: list[tuple[int, ...]] | None = None

    @property
    def candidates(self) -> tuple[int, ...]:
        return self._candidates

    def param_names(self) -> list[str]:
        return [f"{self.name}.{level}" for level in range(1, self.levels)]

    def _legal_next(self, product: int, factor: int) -> bool:
        """Whether `factor` may follow inner factors whose product is `product`."""
        if product * factor > self.extent:
            return False
        return self.policy != "factors" or (self.extent // product) % factor == 0

    def _with_outer(self, inner: Sequence[int]) -> tuple[int, ...]:
        return (-(-self.extent // math.prod(inner)), *inner)

    def _count(self) -> int:
        # Count inner tuples by dynamic programming over the running product (no materialisation).
        counts: dict[int, int] = {1: 1}
        for _ in range(self.levels - 1):
            nxt: dict[int, int] = {}
            for product, n in counts.items():
                for c in self._candidates:
                    if self._legal_next(product, c):
                        nxt[product * c] = nxt.get(product * c, 0) + n
            counts = nxt
        return sum(counts.values())

    def size(self) -> int:
        return self._count()

    def values(self) -> Iterator[tuple[int, ...]]:
        partial: list[tuple[int, ...]] = [()]
        for _ in range(self.levels - 1):
            partial = [
                (*p, c) for p in partial for c in self._candidates if self._legal_next(math.prod(p), c)
            ]
        for inner in partial:
            yield self._with_outer(inner)

    def sample(self, rng: np.random.Generator) -> tuple[int, ...]:
        if self._materialised is None and self._count() <= _MAX_MATERIALISED_SPLITS:
            self._materialised = list(self.values())
        if self._materialised is not None:
            return self._materialised[int(rng.integers(len(self._materialised)))]
        # Too many tuples to list: sample level by level among the factors still legal (not exactly uniform).
        inner: list[int] = []
        for _ in range(self.levels - 1):
            product = math.prod(inner)
            legal = [c for c in self._candidates if self._legal_next(product, c)]
            inner.append(legal[int(rng.integers(len(legal)))])
        return self._with_outer(inner)

    def check(self, value: ConfigValue) -> None:
        where = f"split knob {self.name!r}"
        if not isinstance(value, tuple) or len(value) != self.levels:
            raise InvalidConfigError(f"{where}: expected {self.levels} factors, got {value!r}")
        if not all(isinstance(f, int) and not isinstance(f, bool) and f >= 1 for f in value):
            raise InvalidConfigError(f"{where}: factors must be positive integers, got {value!r}")
        inner = [int(f) for f in value[1:]]
        product = 1
        for f in inner:
            if f not in self._index:
                raise InvalidConfigError(f"{where}: factor {f} is not a candidate ({self.policy}) of {self.extent}")
            if not self._legal_next(product, f):
                raise InvalidConfigError(f"{where}: inner factors {inner} do not fit extent {self.extent}")
            product *= f
        if value[0] != -(-self.extent // product):
            raise InvalidConfigError(
                f"{where}: outer factor must be ceil({self.extent}/{product}) = {-(-self.extent // product)}, "
                f"got {value[0]}"
            )

    def _clamp(self, product: int, index: int) -> int:
        for c in reversed(self._candidates[: index + 1]):
            if self._legal_next(product, c):
                return c
        return 1  # 1 is always a candidate and always legal

    def suggest(self, trial: optuna.trial.BaseTrial) -> tuple[int, ...]:
        inner: list[int] = []
        for param in self.param_names():
            index = trial.suggest_int(param, 0, len(self._candidates) - 1)
            inner.append(self._clamp(math.prod(inner), index))
        return self._with_outer(inner)

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        # start-up: optuna takes ~0.2 s to import; a space (the compiler reads configs) needs it only for a study
        from optuna.distributions import IntDistribution

        return {p: IntDistribution(0, len(self._candidates) - 1) for p in self.param_names()}

    def to_params(self, value: ConfigValue) -> dict[str, Any]:
        self.check(value)
        assert isinstance(value, tuple)
        return {p: self._index[int(f)] for p, f in zip(self.param_names(), value[1:])}

    def neighbors(self, value: ConfigValue) -> list[ConfigValue]:
        self.check(value)
        assert isinstance(value, tuple)
        inner = [int(f) for f in value[1:]]
        found: list[ConfigValue] = []
        seen = {value}

        def offer(candidate_inner: list[int]) -> None:
            product = 1
            for f in candidate_inner:
                if f not in self._index or not self._legal_next(product, f):
                    return
                product *= f
            candidate = self._with_outer(candidate_inner)
            if candidate not in seen:
                seen.add(candidate)
                found.append(candidate)

        for level, f in enumerate(inner):
            position = self._index[f]
            for step in (-1, 1):  # the next smaller / larger candidate at one level
                if 0 <= position + step < len(self._candidates):
                    offer([*inner[:level], self._candidates[position + step], *inner[level + 1 :]])
        for a in range(len(inner)):  # exchange the factors of two inner levels
            for b in range(a + 1, len(inner)):
                swapped = list(inner)
                swapped[a], swapped[b] = swapped[b], swapped[a]
                offer(swapped)
        return found


# ---------------------------------------------------------------------------------------------------------------
# Choices, integers, booleans
# ---------------------------------------------------------------------------------------------------------------


def _categorical_friendly(values: Sequence[ConfigValue]) -> bool:
    """Optuna categoricals compare choices with ==, so only homogeneous str/int/bool lists are used as-is."""
    kinds = {type(v) for v in values}
    return len(kinds) == 1 and kinds <= {str, int, bool}


class ChoiceKnob(Knob):
    """One value out of an explicit list (loop orders, unroll limits, layouts...)."""

    def __init__(self, name: str, values: Sequence[Any]) -> None:
        frozen = [freeze_value(v) for v in values]
        if not frozen:
            raise ValueError(f"choice knob {name!r} needs at least one value")
        if len(set(map(repr, frozen))) != len(frozen):
            raise ValueError(f"choice knob {name!r} has repeated values: {frozen!r}")
        self.name = name
        self.choices: tuple[ConfigValue, ...] = tuple(frozen)
        self._by_value = _categorical_friendly(self.choices)

    def size(self) -> int:
        return len(self.choices)

    def values(self) -> Iterator[ConfigValue]:
        return iter(self.choices)

    def sample(self, rng: np.random.Generator) -> ConfigValue:
        return self.choices[int(rng.integers(len(self.choices)))]

    def _position(self, value: ConfigValue) -> int:
        for i, choice in enumerate(self.choices):
            if type(choice) is type(value) and choice == value:
                return i
        raise InvalidConfigError(f"choice knob {self.name!r}: {value!r} is not one of {list(self.choices)!r}")

    def check(self, value: ConfigValue) -> None:
        self._position(value)

    def suggest(self, trial: optuna.trial.BaseTrial) -> ConfigValue:
        if self._by_value:
            return freeze_value(trial.suggest_categorical(self.name, list(self.choices)))  # type: ignore[arg-type]
        return self.choices[trial.suggest_categorical(self.name, list(range(len(self.choices))))]

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        # start-up: optuna takes ~0.2 s to import; a space (the compiler reads configs) needs it only for a study
        from optuna.distributions import CategoricalDistribution

        choices = list(self.choices) if self._by_value else list(range(len(self.choices)))
        return {self.name: CategoricalDistribution(choices)}  # type: ignore[arg-type]

    def to_params(self, value: ConfigValue) -> dict[str, Any]:
        position = self._position(value)
        return {self.name: self.choices[position] if self._by_value else position}

    def neighbors(self, value: ConfigValue) -> list[ConfigValue]:
        position = self._position(value)
        return [c for i, c in enumerate(self.choices) if i != position]


class IntKnob(Knob):
    """An integer in [low, high]; `log=True` for scale-like knobs (unroll steps, block sizes)."""

    def __init__(self, name: str, low: int, high: int, log: bool = False) -> None:
        if high < low:
            raise ValueError(f"int knob {name!r}: high {high} < low {low}")
        if log and low < 1:
            raise ValueError(f"int knob {name!r}: a log-scaled knob needs low >= 1")
        self.name = name
        self.low = low
        self.high = high
        self.log = log

    def size(self) -> int:
        return self.high - self.low + 1

    def values(self) -> Iterator[ConfigValue]:
        return iter(range(self.low, self.high + 1))

    def sample(self, rng: np.random.Generator) -> ConfigValue:
        if self.log:
            return int(min(self.high, max(self.low, round(math.exp(rng.uniform(math.log(self.low),
                                                                                 math.log(self.high)))))))
        return int(rng.integers(self.low, self.high + 1))

    def check(self, value: ConfigValue) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or not self.low <= value <= self.high:
            raise InvalidConfigError(
                f"int knob {self.name!r}: {value!r} is not an integer in [{self.low}, {self.high}]"
            )

    def suggest(self, trial: optuna.trial.BaseTrial) -> ConfigValue:
        return trial.suggest_int(self.name, self.low, self.high, log=self.log)

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        # start-up: optuna takes ~0.2 s to import; a space (the compiler reads configs) needs it only for a study
        from optuna.distributions import IntDistribution

        return {self.name: IntDistribution(self.low, self.high, log=self.log)}

    def to_params(self, value: ConfigValue) -> dict[str, Any]:
        self.check(value)
        return {self.name: value}

    def neighbors(self, value: ConfigValue) -> list[ConfigValue]:
        self.check(value)
        assert isinstance(value, int)
        steps = [value - 1, value + 1]
        if self.log:
            steps += [value // 2, value * 2]
        found: list[ConfigValue] = []
        for v in steps:
            if self.low <= v <= self.high and v != value and v not in found:
                found.append(v)
        return found


class BoolKnob(Knob):
    """On/off switches (unroll this loop, vectorize that one)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def size(self) -> int:
        return 2

    def values(self) -> Iterator[ConfigValue]:
        return iter((False, True))

    def sample(self, rng: np.random.Generator) -> ConfigValue:
        return bool(rng.integers(2))

    def check(self, value: ConfigValue) -> None:
        if not isinstance(value, bool):
            raise InvalidConfigError(f"bool knob {self.name!r}: expected true/false, got {value!r}")

    def suggest(self, trial: optuna.trial.BaseTrial) -> ConfigValue:
        return bool(trial.suggest_categorical(self.name, [False, True]))

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        # start-up: optuna takes ~0.2 s to import; a space (the compiler reads configs) needs it only for a study
        from optuna.distributions import CategoricalDistribution

        return {self.name: CategoricalDistribution([False, True])}

    def to_params(self, value: ConfigValue) -> dict[str, Any]:
        self.check(value)
        return {self.name: value}

    def neighbors(self, value: ConfigValue) -> list[ConfigValue]:
        self.check(value)
        return [not value]
