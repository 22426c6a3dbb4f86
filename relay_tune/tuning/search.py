"""Search strategies: which configs of one task to measure next.

`OptunaSearch` runs one Optuna study per (task, target) through ask/tell, so the tuner owns the loop and the
measurement happens in its own processes. Its storage is the embedded journal file by default (several tuning
processes on one machine share a study through it without a server); `sqlite:///...` and other database URLs
work too.

Rules the strategies keep:
- A config is never measured twice. Before a proposal is handed out it is checked against the tuning log (also
  records written by other processes) and the study's trials (also other processes' trials in flight); a repeat
  is answered from the earlier result without measuring. Processes sharing a journal take turns (a file lock)
  to ask for and claim configs, so a claim is always seen by the next asker (`ClaimLock`); on PostgreSQL they take
  turns the same way through the database's lock, and its claims table decides (`relay_tune.tuning.distributed`);
  on other shared storages two processes that claim the same config at the same moment both publish their claim
  and re-check, and the lower trial number keeps it (a rare duplicate remains possible there).
- Failures teach the sampler: a failed measurement is told as a worst value (`FAILURE_VALUE`), which puts it in
  TPE's "bad" group; configs the space's constraints reject are told the same and never measured or counted.
- Resuming rebuilds the study: records in the log that the study does not know are added as finished trials, and
  trials left running by a process that no longer exists are closed as failed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from relay_tune.records.database import Database
from relay_tune.records.log_format import comparable_records
from relay_tune.records.measure import MeasureInput, MeasureResult
from relay_tune.tuning import distributed
from relay_tune.tuning.task import TuneTask
from relay_tune.tuning.workers import worker_identity, worker_is_gone
from search_space import Config

if TYPE_CHECKING:
    import optuna

# What a failed measurement is worth to the sampler: worse than any real kernel (seconds).
FAILURE_VALUE = 1e9
# Above this many valid configs a space is not enumerated to look for unvisited points.
_ENUMERATION_LIMIT = 20_000


class SearchStrategy(ABC):
    """Proposes configs of one task and learns from their measurements.

    Call order: `prioritize` (optional, before the first proposal) -> `propose(n)` -> the driver measures every
    proposed config -> `update(inputs, results)` with all of them -> `propose` ... -> `close()`.
    `propose` returns at most `n` configs that have never been measured; fewer (or none) means the space is
    exhausted.
    """

    name: str = "search"

    @abstractmethod
    def propose(self, n: int) -> list[Config]: ...

    @abstractmethod
    def update(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None: ...

    def prioritize(self, configs: Sequence[Config]) -> None:  # noqa: B027 - optional hook
        """Propose these configs (e.g. the default schedule, good schedules from elsewhere) before any others."""

    def prepare(self, n: int) -> None:  # noqa: B027 - optional hook
        """Do the expensive part of the next `propose(n)` (fitting, ranking) now. The driver calls it before it
        takes the lock that workers sharing a database claim their configs under, so `propose` holds it briefly."""

    def discard(self, configs: Sequence[Config]) -> None:  # noqa: B027 - optional hook
        """These proposals will not be measured here: a shared database gave them to another worker (or had no
        budget left for them)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Give up proposals that were never measured (e.g. after an interrupt)."""


StrategyFactory = Callable[[TuneTask, Database], SearchStrategy]


def measured_values(records: Sequence[Any]) -> dict[str, float]:
    """Config key -> what the sampler should be told, from the log (the best measurement per config). Where the
    log holds times taken in different ways, only those of the newest way count (`comparable_records`): configs
    timed only the old way are not measured for this search, and may be measured again."""
    values: dict[str, float] = {}
    for record in comparable_records(records):
        value = record.cost if record.ok else FAILURE_VALUE
        if record.config_key not in values or value < values[record.config_key]:
            values[record.config_key] = value
    return values


def _unvisited_random(
    task: TuneTask, visited: set[str], rng: np.random.Generator, attempts: int = 256
) -> Config | None:
    """A random valid config not in `visited`, or None when (as far as we can tell) none is left."""
    for _ in range(attempts):
        config = task.space.sample(rng)
        if config.key not in visited:
            return config
    if task.space.size() <= _ENUMERATION_LIMIT:
        left = [c for c in task.space.enumerate() if c.key not in visited]
        return left[int(rng.integers(len(left)))] if left else None
    return None


class RandomSearch(SearchStrategy):
    """Uniformly random unvisited configs (a baseline; no Optuna)."""

    name = "random"

    def __init__(self, task: TuneTask, database: Database, seed: int = 0) -> None:
        self.task = task
        self.database = database
        self._rng = np.random.default_rng(_stable_seed(seed, task.key))
        self._first: list[Config] = []
        self._proposed: set[str] = set()

    def prioritize(self, configs: Sequence[Config]) -> None:
        self._first.extend(configs)

    def propose(self, n: int) -> list[Config]:
        visited = set(measured_values(self.database.records(self.task.key, self.task.target))) | self._proposed
        chosen: list[Config] = []
        while self._first and len(chosen) < n:
            config = self._first.pop(0)
            if config.key not in visited and self.task.space.is_valid(config):
                chosen.append(config)
                visited.add(config.key)
        while len(chosen) < n:
            config = _unvisited_random(self.task, visited, self._rng)
            if config is None:
                break
            chosen.append(config)
            visited.add(config.key)
        self._proposed.update(c.key for c in chosen)
        return chosen

    def update(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        return None


# ---------------------------------------------------------------------------------------------------------------
# Optuna
# ---------------------------------------------------------------------------------------------------------------


def _stable_seed(seed: int, key: str) -> int:
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


_STORAGES: dict[str, Any] = {}


IN_MEMORY_STORAGE_NAMES = frozenset({"memory", "none", ":memory:"})


def journal_path(storage: object) -> Path | None:
    """The journal file a storage argument names (a path, or "journal:<path>"); None for URLs and objects."""
    if not isinstance(storage, str | os.PathLike):
        return None
    if isinstance(storage, str) and storage.lower() in IN_MEMORY_STORAGE_NAMES:
        return None
    text = os.fspath(storage)
    if text.startswith("journal:"):
        text = text[len("journal:"):]
    elif "://" in text:
        return None
    return Path(text).resolve()


def open_storage(storage: str | os.PathLike[str] | optuna.storages.BaseStorage | None) -> Any:
    """An Optuna storage from a URL or path; a path (or "journal:<path>") is an embedded journal file.

    Storages are shared per process, so several studies in one journal replay it once.
    """
    # start-up: optuna takes ~0.2 s to import; `relay_tune.tuning` (the compiler reads its logs) must not pay it
    import optuna

    if storage is None or isinstance(storage, optuna.storages.BaseStorage):
        return storage
    if isinstance(storage, str) and storage.lower() in IN_MEMORY_STORAGE_NAMES:
        return None  # Optuna's in-memory storage: nothing written, nothing shared
    journal = journal_path(storage)
    if journal is None:
        if distributed.is_database_url(storage):
            return distributed.rdb_storage(os.fspath(storage))  # PostgreSQL: heartbeats on claims
        return os.fspath(storage)  # another RDB URL (sqlite:///, mysql://, ...): Optuna opens and caches it
    path = str(journal)
    if path not in _STORAGES:
        # start-up: optuna takes ~0.2 s to import; `relay_tune.tuning` (the compiler reads its logs) must not pay it
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        # start-up: imports optuna, as the two imports above
        from relay_tune.tuning.journal_lock import InterruptSafeSymlinkLock

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        _STORAGES[path] = JournalStorage(JournalFileBackend(path, lock_obj=InterruptSafeSymlinkLock(path)))
    return _STORAGES[path]


def space_digest(task: TuneTask) -> str:
    """A short digest of the space's Optuna parameters: a changed space gets a fresh study.

    Optuna refuses a categorical parameter whose choices differ from earlier trials, so a study cannot outlive a
    change of its space; the measurements are not lost, the new study imports them from the log.
    """
    # start-up: optuna takes ~0.2 s to import; `relay_tune.tuning` (the compiler reads its logs) must not pay it
    from optuna.distributions import distribution_to_json

    text = json.dumps({name: distribution_to_json(d) for name, d in sorted(task.space.distributions().items())})
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def default_study_name(task: TuneTask) -> str:
    name = f"{task.key}|{task.target}|space-{space_digest(task)}"
    if len(name) > 200:  # database storages limit name length
        name = "relay-tune-" + hashlib.sha256(name.encode()).hexdigest()[:32]
    return name


def make_sampler(kind: str, seed: int, n_startup_trials: int = 10) -> optuna.samplers.BaseSampler:
    # start-up: optuna takes ~0.2 s to import; `relay_tune.tuning` (the compiler reads its logs) must not pay it
    import optuna

    if kind == "tpe":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # multivariate: tile factors interact; constant_liar: a batch is asked before any result is told.
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials, multivariate=True,
                                              constant_liar=True)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler {kind!r} (expected 'tpe' or 'random')")


class ClaimLock(Protocol):
    """Makes one study's claim step (ask, check against the log and the study, claim) exclusive among the processes
    that share the study, so a claim is always seen by the next asker."""

    def hold(self, study: Any) -> contextlib.AbstractContextManager[None]:
        """Held around each claim step of `study`."""
        ...

    def close(self, study: Any) -> None:
        """The search of `study` ends in this process."""
        ...


class JournalClaimLock:
    """Processes sharing a journal file (one machine) take turns through a file lock beside it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @contextlib.contextmanager
    def hold(self, study: Any) -> Iterator[None]:
        with open(self.path, "a") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def close(self, study: Any) -> None:
        pass


def claim_lock_for(storage: object) -> ClaimLock | None:
    """The claim lock of a storage: a file lock beside a journal, the database's lock on PostgreSQL
    (`relay_tune.tuning.distributed.StudyClaimLock`), None for in-memory and other storages."""
    journal = journal_path(storage)
    if journal is not None:
        return JournalClaimLock(f"{journal}.claims.lock")
    if isinstance(storage, str) and distributed.is_database_url(storage):
        return distributed.StudyClaimLock(storage)
    return None


@dataclass(frozen=True)
class _Claim:
    number: int  # trial number
    value: float | None  # None while the trial is still running


class OptunaSearch(SearchStrategy):
    """Ask/tell search with an Optuna sampler over the task's space (see the module docstring)."""

    def __init__(
        self,
        task: TuneTask,
        database: Database,
        *,
        storage: str | os.PathLike[str] | optuna.storages.BaseStorage | None = None,
        sampler: str = "tpe",
        seed: int = 0,
        study_name: str | None = None,
        n_startup_trials: int = 10,
        claim_lock: ClaimLock | None = None,
    ) -> None:
        # start-up: optuna takes ~0.2 s to import; `relay_tune.tuning` (the compiler reads its logs) must not pay it
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per trial would drown the progress view
        self.task = task
        self.database = database
        self.name = f"optuna-{sampler}"
        self._optuna = optuna
        self._seed = _stable_seed(seed, task.key)
        self._rng = np.random.default_rng(self._seed)
        self._shared = open_storage(storage) is not None
        # Processes sharing a journal or a PostgreSQL database serialise their claim step (`claim_lock_for`),
        # which makes "never measured twice" exact; other shared storages fall back to the lowest-trial-number rule.
        self._claim_lock = claim_lock if claim_lock is not None else claim_lock_for(storage)
        self._database_url = os.fspath(storage) if distributed.is_database_url(storage) else None
        self._worker = worker_identity()
        opened = open_storage(storage)
        self._heartbeats = distributed.heartbeats_for(opened) if opened is not None else None
        self.study = optuna.create_study(
            storage=opened,
            sampler=make_sampler(sampler, self._seed, n_startup_trials),
            study_name=study_name or default_study_name(task),
            direction="minimize",
            load_if_exists=True,
        )
        self._distributions = task.space.distributions()
        self._pending: dict[str, optuna.trial.Trial] = {}
        self._close_stale_trials()
        self._import_log()

    # -- start-up ------------------------------------------------------------------------------------------------

    def _close_stale_trials(self) -> None:
        running = self.study.get_trials(deepcopy=False, states=(self._optuna.trial.TrialState.RUNNING,))
        for trial in running:
            owner = trial.user_attrs.get("worker")
            if isinstance(owner, str) and worker_is_gone(owner):
                self.study.tell(trial.number, state=self._optuna.trial.TrialState.FAIL, skip_if_finished=True)

    def _import_log(self) -> None:
        """Add measured configs the study does not know as finished trials (e.g. a fresh or in-memory storage)."""
        complete = self._optuna.trial.TrialState.COMPLETE
        known = {t.user_attrs.get("config_key") for t in self.study.get_trials(deepcopy=False, states=(complete,))}
        records = self.database.records(self.task.key, self.task.target)
        configs = {r.config_key: r.config for r in records}
        imported = []
        for key, value in measured_values(records).items():
            if key in known:
                continue
            config = configs[key]
            if not self.task.space.is_valid(config):
                continue  # measured under an older space; it still counts as visited
            imported.append(self._optuna.trial.create_trial(
                params=self.task.space.to_params(config), distributions=self._distributions, value=value,
                user_attrs={"config_key": key, "source": "log"},
            ))
        if imported:
            self.study.add_trials(imported)

    # -- proposing -----------------------------------------------------------------------------------------------

    def prioritize(self, configs: Sequence[Config]) -> None:
        visited = set(measured_values(self.database.records(self.task.key, self.task.target)))
        waiting = self.study.get_trials(deepcopy=False, states=(self._optuna.trial.TrialState.WAITING,))
        queued = [t.system_attrs.get("fixed_params") for t in waiting]
        for config in configs:
            if config.key in visited or not self.task.space.is_valid(config):
                continue
            params = self.task.space.to_params(config)
            # Optuna's own skip_if_exists also skips params of failed trials, which would lose the config forever.
            if params not in queued:
                self.study.enqueue_trial(params)
                queued.append(params)

    def _claims(self) -> dict[str, _Claim]:
        """Config key -> the lowest-numbered live trial (running or complete) that holds it."""
        complete = self._optuna.trial.TrialState.COMPLETE
        states = (self._optuna.trial.TrialState.RUNNING, complete)
        claims: dict[str, _Claim] = {}
        for trial in self.study.get_trials(deepcopy=False, states=states):
            key = trial.user_attrs.get("config_key")
            if isinstance(key, str) and (key not in claims or trial.number < claims[key].number):
                claims[key] = _Claim(trial.number, trial.value if trial.state == complete else None)
        return claims

    def propose(self, n: int) -> list[Config]:
        chosen: list[Config] = []
        for _ in range(4):  # a proposal lost to another process's earlier claim is replaced
            kept, asked = self._propose_once(n - len(chosen))
            chosen += kept
            if len(chosen) >= n or asked == 0:
                break
        return chosen

    @contextlib.contextmanager
    def _claiming(self) -> Iterator[None]:
        if self._claim_lock is None:
            yield
            return
        with self._claim_lock.hold(self.study):
            yield

    def _propose_once(self, n: int) -> tuple[list[Config], int]:
        """Up to `n` new proposals, and how many were found before dropping those claimed elsewhere."""
        with self._claiming():
            return self._propose_claimed(n)

    def _propose_claimed(self, n: int) -> tuple[list[Config], int]:
        trial_state = self._optuna.trial.TrialState
        measured = measured_values(self.database.records(self.task.key, self.task.target))
        claims = self._claims()
        proposals: list[tuple[Any, Config]] = []
        misses = 0
        attempts = 0
        while len(proposals) < n and attempts < 8 * n + 32:
            attempts += 1
            if misses >= 2 * n + 4:
                # The sampler keeps returning known points (it has converged or the space is nearly used up):
                # steer it with a random unvisited config.
                visited = set(measured) | set(claims) | {c.key for _, c in proposals}
                fresh = _unvisited_random(self.task, visited, self._rng)
                if fresh is None:
                    break
                self.study.enqueue_trial(self.task.space.to_params(fresh))
            trial = self.study.ask()
            config = self.task.space.to_optuna(trial)
            key = config.key
            if not self.task.space.is_valid(config):
                trial.set_user_attr("rejected", True)
                self.study.tell(trial, FAILURE_VALUE)
                misses += 1
                continue
            if key in measured:
                trial.set_user_attr("answered_from", "log")
                self.study.tell(trial, measured[key])
                misses += 1
                continue
            holder = claims.get(key)
            if holder is not None:
                if holder.value is not None:
                    trial.set_user_attr("answered_from", f"trial {holder.number}")
                    self.study.tell(trial, holder.value)
                else:  # being measured right now (here or by another process): no value to tell yet
                    self.study.tell(trial, state=trial_state.FAIL)
                misses += 1
                continue
            trial.set_user_attr("config_key", key)
            trial.set_user_attr("worker", self._worker)
            if self._heartbeats is not None:
                self._heartbeats.hold(trial._trial_id)
            claims[key] = _Claim(trial.number, None)
            proposals.append((trial, config))
            misses = 0
        asked = len(proposals)
        if self._shared and self._claim_lock is None and proposals:
            proposals = self._keep_first_claims(proposals)
        for trial, config in proposals:
            self._pending[config.key] = trial
        return [config for _, config in proposals], asked

    def _keep_first_claims(self, proposals: list[tuple[Any, Config]]) -> list[tuple[Any, Config]]:
        """Drop proposals another process claimed first (lower trial number) while we were asking."""
        claims = self._claims()
        kept = []
        for trial, config in proposals:
            holder = claims.get(config.key)
            if holder is not None and holder.number != trial.number:
                self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
            else:
                kept.append((trial, config))
        return kept

    # -- learning ------------------------------------------------------------------------------------------------

    def update(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        for measure_input, result in zip(inputs, results, strict=True):
            trial = self._pending.pop(measure_input.config.key, None)
            if trial is None:
                continue
            # skip_if_finished: a claim whose heartbeat went stale (a stalled process) was failed by another worker
            if result.ok:
                assert result.cost is not None
                self.study.tell(trial, result.cost, skip_if_finished=True)
            else:
                assert result.error_kind is not None
                with contextlib.suppress(self._optuna.exceptions.UpdateFinishedTrialError):
                    trial.set_user_attr("error_kind", result.error_kind.name)
                self.study.tell(trial, FAILURE_VALUE, skip_if_finished=True)
            self._release(trial)

    def discard(self, configs: Sequence[Config]) -> None:
        for config in configs:
            trial = self._pending.pop(config.key, None)
            if trial is None:
                continue
            self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL, skip_if_finished=True)
            self._release(trial)
            # Not measured, so not learnt: its config goes back to the queue (its claim in the database may be a
            # dead worker's that is not stale yet; a live worker's config is never asked twice by the study).
            self.study.enqueue_trial(trial.params)

    def _release(self, trial: Any) -> None:
        if self._heartbeats is not None:
            self._heartbeats.release(trial._trial_id)

    def close(self) -> None:
        for trial in self._pending.values():
            self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL, skip_if_finished=True)
            self._release(trial)
        self._pending.clear()
        if self._claim_lock is not None:
            self._claim_lock.close(self.study)


def optuna_search(
    storage: str | os.PathLike[str] | optuna.storages.BaseStorage | None = None,
    sampler: str = "tpe",
    seed: int = 0,
    n_startup_trials: int = 10,
) -> StrategyFactory:
    """A factory making one `OptunaSearch` per task, all on the same storage."""

    def make(task: TuneTask, database: Database) -> SearchStrategy:
        return OptunaSearch(task, database, storage=storage, sampler=sampler, seed=seed,
                            n_startup_trials=n_startup_trials)

    where = "memory" if storage is None else os.fspath(storage) if isinstance(storage, str | os.PathLike) \
        else type(storage).__name__
    make.description = f"optuna-{sampler} seed={seed} storage={where}"  # type: ignore[attr-defined]
    return make


def random_search(seed: int = 0) -> StrategyFactory:
    def make(task: TuneTask, database: Database) -> SearchStrategy:
        return RandomSearch(task, database, seed=seed)

    make.description = f"random seed={seed}"  # type: ignore[attr-defined]
    return make
