"""Simulated measurement: a builder that compiles nothing and a runner that sleeps instead of running a kernel.

For measuring the tuning machinery itself (search, storage, scheduling, claims, budget) at scale, where real
kernels would make the cost of the machinery invisible, or where many workers share one small machine.
Everything but the two measurement steps is the production code: `tune` with a real task, its space, its search
strategy and its storage.

The simulated cost of a config is a fixed function of its key (a hash), so every worker agrees on it and the search
has something to learn from; it has no relation to the real speed of the config.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from collections.abc import Sequence

from relay_tune.records.measure import BuildResult, RunResult
from relay_tune.tuning.builder import Builder
from relay_tune.tuning.distributed import PostgresDatabase, SharedBudget, is_database_url
from relay_tune.tuning.driver import tune
from relay_tune.tuning.hostlock import HostLockedRunner
from relay_tune.tuning.runner import Runner
from relay_tune.tuning.task import BuildArtifact, TuneTask
from relay_tune.tuning.testing import MatmulTask, small_tasks
from relay_tune.tuning.tune_model import make_search
from search_space import Config

__all__ = ["SimulatedBuilder", "SleepRunner", "simulated_cost", "simulated_tasks"]


def simulated_cost(config_key: str, base: float = 1e-4) -> float:
    """A deterministic pseudo cost in seconds, between `base` and 10 x `base`."""
    digest = hashlib.sha256(config_key.encode()).digest()
    return base * (1.0 + 9.0 * int.from_bytes(digest[:4], "little") / 2**32)


def simulated_tasks(space: str = "small") -> list[MatmulTask]:
    """The tasks a simulated worker tunes: "small", the two matmuls of `small_tasks` (260 configs together), or
    "large", two matmuls whose sizes have many divisors (3,778 configs together), for budgets of thousands of
    trials that must not exhaust the space (a nearly exhausted space changes what the search does)."""
    if space == "small":
        return small_tasks()
    if space == "large":
        return [MatmulTask(48, 720, 360, weight=2), MatmulTask(24, 840, 240, weight=1)]
    raise ValueError(f"unknown simulated space {space!r}: small or large")


class SimulatedBuilder(Builder):
    """Returns the config itself as the "artifact" of each build, at once."""

    def build(self, task: TuneTask, configs: Sequence[Config]) -> list[BuildResult]:
        return [BuildResult(artifact=config) for config in configs]


class SleepRunner(Runner):
    """Sleeps `seconds` per measurement and reports `simulated_cost` of the config."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def run(self, task: TuneTask, artifact: BuildArtifact) -> RunResult:
        started = time.monotonic()
        time.sleep(self.seconds)
        key = artifact.key if isinstance(artifact, Config) else repr(artifact)
        return RunResult(costs=(simulated_cost(key),), run_seconds=time.monotonic() - started)


def main(argv: Sequence[str] | None = None) -> int:
    """One simulated tuning worker: `python -m relay_tune.tuning.simulated --storage URL --trials N --log LOG`.

    Tunes two matmul tasks (`simulated_tasks`) with the production driver,
    search and storage, measuring by sleeping. Prints one JSON line with what this worker did.
    """
    parser = argparse.ArgumentParser(prog="python -m relay_tune.tuning.simulated", description=main.__doc__)
    parser.add_argument("--storage", required=True, help="postgresql:// URL (or a journal path)")
    parser.add_argument("--trials", type=int, required=True, help="the budget of all workers together")
    parser.add_argument("--log", required=True, help="this worker's log")
    parser.add_argument("--seconds", type=float, default=1.0, help="sleep per measurement (default 1)")
    parser.add_argument("--search", default="tpe", help="xgb, tpe or random (default tpe)")
    parser.add_argument("--batch", type=int, default=4, help="trials per round (default 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--space", choices=("small", "large"), default="small",
                        help="the tasks' search spaces: small (260 configs) or large (3,778; default small)")
    parser.add_argument("--host-lock", action="store_true", help="measure in turn with other workers on this host")
    parser.add_argument("--start-at", type=float, metavar="EPOCH",
                        help="after setting up, wait until this time.time() (workers that start together)")
    args = parser.parse_args(argv)
    tasks = simulated_tasks(args.space)
    database = PostgresDatabase(args.storage, mirror=args.log) if is_database_url(args.storage) else None
    budget = SharedBudget.factory(database, wait_poll_s=0.2) if database is not None else None
    runner: Runner = SleepRunner(args.seconds)
    if args.host_lock:
        runner = HostLockedRunner(runner)
    strategy = make_search(args.search, storage=args.storage, seed=args.seed, log_path=args.log)
    if args.start_at is not None:
        time.sleep(max(0.0, args.start_at - time.time()))
    started = time.monotonic()
    cpu = time.process_time()
    summary = tune(tasks, args.trials, args.log, builder=SimulatedBuilder(), runner=runner, strategy=strategy,
                   batch_size=args.batch, seed=args.seed, database=database, budget=budget)
    print(json.dumps({"pid": os.getpid(), "measured": summary.trials_this_session, "seconds": summary.seconds,
                      "wall_s": time.monotonic() - started,
                      "cpu_s": time.process_time() - cpu, "ended_at": time.time(),
                      "duplicates": getattr(database, "duplicates", 0)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
