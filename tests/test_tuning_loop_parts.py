"""The tuning loop's parts: phase timings through the callbacks, the local and the shared trial budget, and the
tuner's modules importing each other one way only."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grimp
import pytest

from relay_tune.tuning import (
    Database,
    LocalBuilder,
    LocalRunner,
    RecordingProgress,
    random_search,
    read_events,
    tune,
)
from relay_tune.tuning.budget import LocalBudget, Next
from relay_tune.tuning.distributed import SharedBudget
from relay_tune.tuning.progress import PhaseTimer, PhaseTimes
from relay_tune.tuning.testing import small_tasks
from search_space import Config


class Proposals:
    """A search that proposes numbered configs and remembers what it was told to discard."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.discarded: list[Config] = []

    def propose(self, n: int) -> list[Config]:
        self.asked.append(n)
        return [Config({"i": i}) for i in range(n)]

    def discard(self, configs: Sequence[Config]) -> None:
        self.discarded.extend(configs)


class Claims:
    """A stand-in for `PostgresDatabase.claim`: answers (granted, recorded, in flight) from a script."""

    def __init__(self, answers: list[tuple[int, int, int]]) -> None:
        self.answers = answers
        self.calls: list[int] = []
        self.released = False

    def claim(self, tasks: Any, total: int, task: Any, configs: Sequence[Config]) -> tuple[list[Config], int, int]:
        self.calls.append(len(configs))
        granted, recorded, in_flight = self.answers.pop(0)
        return list(configs[:granted]), recorded, in_flight

    def release_claims(self) -> None:
        self.released = True


def test_phase_times_reach_the_callbacks_the_summary_and_the_log(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    progress = RecordingProgress()
    with LocalBuilder(n_parallel=2) as builder, LocalRunner(number=1, repeat=1, min_repeat_ms=1) as runner:
        summary = tune(small_tasks(), 6, log, builder=builder, runner=runner, strategy=random_search(seed=0),
                       progress=progress, batch_size=3)
    phases = [phase for phase, _ in progress.phases]
    assert summary.trials_this_session == 6
    assert set(phases) == {"storage", "search", "build", "run", "total"} and phases.count("total") == 1
    assert phases[-1] == "total" and all(seconds >= 0 for _, seconds in progress.phases)
    for phase, seconds in summary.seconds.items():
        assert seconds == pytest.approx(sum(s for p, s in progress.phases if p == phase))
    assert "rounds" not in summary.seconds  # claim rounds: only on a shared budget
    (end,) = [e for e in read_events(log) if e.event == "session_end"]
    assert end.data["seconds"] == pytest.approx(summary.seconds) and end.data["trials_in_log"] == 6


def test_phase_times_count_claim_rounds() -> None:
    times = PhaseTimes()
    timer = PhaseTimer(times)
    for _ in range(3):
        with timer("storage", "claim"):
            pass
    assert set(times.as_dict()) == {"storage", "claim", "rounds"} and times.as_dict()["rounds"] == 3


def test_local_budget_grants_what_is_left_of_the_total() -> None:
    task = small_tasks()[0]
    budget = LocalBudget([task], total=10, spent=4)
    search = Proposals()
    timer = PhaseTimer(PhaseTimes())
    assert not budget.exhausted(recorded=6)
    grant = budget.grant(task, search, want=8, recorded=7, timer=timer)  # another process recorded 3 meanwhile
    assert grant.next is Next.MEASURE and len(grant.configs) == 3 and budget.spent == 7
    assert budget.exhausted(recorded=10) and not search.discarded
    budget.spent = 10
    assert budget.grant(task, search, want=8, recorded=10, timer=timer).configs == []


def test_shared_budget_measures_retries_waits_and_ends() -> None:
    task = small_tasks()[0]
    claims = Claims([
        (2, 3, 1),  # 2 of 4 proposals granted: the others go back to the search
        (0, 5, 5),  # all claimed by others: the budget is full, try again
        (0, 5, 5),  # full: the next look proposes nothing and waits
        (0, 6, 2),  # room again: propose ...
        (1, 6, 2),  # ... and claim
        (0, 10, 0),  # every trial recorded: the run ends
    ])
    budget = SharedBudget(claims, [task], total=10, spent=0, wait_poll_s=0.0)  # type: ignore[arg-type]
    search = Proposals()
    timer = PhaseTimer(PhaseTimes())
    first = budget.grant(task, search, 4, 0, timer)
    assert first.next is Next.MEASURE and len(first.configs) == 2 and len(search.discarded) == 2
    assert budget.spent == 4
    assert budget.grant(task, search, 4, 0, timer).next is Next.RETRY
    assert budget.grant(task, search, 4, 0, timer).next is Next.RETRY and claims.calls[-1] == 0
    again = budget.grant(task, search, 4, 0, timer)
    assert again.next is Next.MEASURE and len(again.configs) == 1 and claims.calls[-2:] == [0, 4]
    assert budget.grant(task, search, 4, 0, timer).next is Next.END
    assert budget.exhausted(10) and not budget.exhausted(9)
    budget.close()
    assert claims.released


def test_the_record_store_interface_holds_records_only() -> None:
    assert not hasattr(Database, "claim") and not hasattr(Database, "shared_budget")


def test_the_tuners_modules_import_each_other_one_way() -> None:
    """No cycle among relay_tune.tuning's modules, type-only imports included."""
    graph = grimp.build_graph("relay_tune", "search_space", "cost_model", include_external_packages=False)
    tuner = {m for m in graph.modules if m.startswith("relay_tune.tuning.")}
    assert "relay_tune.tuning.driver" in tuner and "relay_tune.tuning.progress" in tuner
    imports = {m: graph.find_modules_directly_imported_by(m) & tuner for m in tuner}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            pytest.fail("import cycle: " + " -> ".join([*path[path.index(module):], module]))
        if module in done:
            return
        for imported in sorted(imports[module]):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(tuner):
        visit(module, [])
