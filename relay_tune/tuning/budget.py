"""The trial budget of a tuning run: how many measurements it may still make, and which configs each round gets.

The tuning loop asks its `TrialBudget` before every round. `LocalBudget` counts the records in the log (which
other processes tuning into the same log append to as well). A budget shared by workers on several machines
claims each round's configs from a database (`relay_tune.tuning.distributed.SharedBudget`).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from relay_tune.tuning.progress import PhaseTimer
from relay_tune.tuning.task import TuneTask
from search_space import Config


class Proposer(Protocol):
    """What a budget needs of a task's search: proposals, and a way to hand back those it does not grant."""

    def propose(self, n: int) -> list[Config]: ...

    def discard(self, configs: Sequence[Config]) -> None: ...


class Next(enum.Enum):
    """What the loop does after asking for a round."""

    MEASURE = "measure"  # measure the granted configs (none: the task's space is used up)
    RETRY = "retry"  # nothing granted now: count the budget again and pick a task again
    END = "end"  # the budget is spent: the run ends


@dataclass(frozen=True)
class Grant:
    """The answer to a request for a round: what to do next, and the configs to measure."""

    next: Next
    configs: list[Config] = field(default_factory=list)


class TrialBudget(ABC):
    """The budget of `total` trials of `tasks`, of which `spent` are measured (or claimed) already.

    Call order: each round `exhausted(recorded)`, then `grant(...)`; `measured()` after each record the database
    accepted; `close()` once, however the run ends.
    """

    def __init__(self, tasks: Sequence[TuneTask], total: int, spent: int) -> None:
        self.tasks = list(tasks)
        self.total = total
        self.spent = spent

    @abstractmethod
    def exhausted(self, recorded: int) -> bool:
        """True when the run must end, given `recorded`, the records of the tasks in the database now."""

    @abstractmethod
    def grant(self, task: TuneTask, search: Proposer, want: int, recorded: int, timer: PhaseTimer) -> Grant:
        """Up to `want` configs of `task` from `search` that the budget has room for (`recorded`: as above)."""

    def measured(self) -> None:
        """One record of a granted config was accepted."""
        self.spent += 1

    def close(self) -> None:  # noqa: B027 - optional hook; a local budget holds nothing
        """Give back what was granted and not measured."""


BudgetFactory = Callable[[Sequence[TuneTask], int, int], TrialBudget]
"""Makes a run's budget from its tasks, its total and the trials already spent (the signature of `TrialBudget`)."""


class LocalBudget(TrialBudget):
    """A budget counted from the records in the log: processes tuning into the same log share it, each re-counting
    every round, so the total overshoots by at most one round per extra process."""

    def exhausted(self, recorded: int) -> bool:
        return max(self.spent, recorded) >= self.total

    def grant(self, task: TuneTask, search: Proposer, want: int, recorded: int, timer: PhaseTimer) -> Grant:
        self.spent = max(self.spent, recorded)
        want = min(want, self.total - self.spent)
        if want <= 0:
            return Grant(Next.MEASURE)
        with timer("search"):
            return Grant(Next.MEASURE, search.propose(want))
