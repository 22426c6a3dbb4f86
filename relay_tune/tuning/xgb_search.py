"""Model-guided search: an XGBoost cost model picks which configs the Optuna study measures next.

`XGBSearch` is an `OptunaSearch` whose proposals come from a plan instead of a sampler. Each round it

1. gathers every measurement of its task: the tuning log (also other processes' records) and the study's trials
   (also other processes' trials on a shared storage), so several tuning processes on one storage all train on
   everything measured so far;
2. retrains the cost model once the data has grown enough since the last fit (every `plan_size` new measurements
   at most, sooner while the data set is small: early models matter most and train in milliseconds);
3. re-plans whenever the model or the measurements changed. The candidate pool holds random configs, proposals
   of a private TPE sampler fed with every measurement, single-knob mutations (one-step neighbours and random
   jumps) of the best measured configs, and the previous plan's best; a few generations mutate the
   best-scoring candidates again. Lowering is the expensive part of a loop-nest feature vector (milliseconds),
   so once a task has a few measurements a cheap knob-feature model of that task screens the whole pool and its
   generations, and only a shortlist (plus TPE's proposals) is lowered and ranked by the loop-nest model; the
   plan is ordered by the two models' standardised scores together;
4. proposes the head of the plan, spread over different knob values (a diversity filter, as in AutoTVM), plus an
   `epsilon` share of random configs, by enqueueing them as trials of the study and asking for them, so Optuna's
   claim bookkeeping guarantees that no config is measured twice (a repeat is answered from the earlier result).

Until `warmup` configs are measured (and one of them ran), there is no model to rank with (unless a loaded model can
already rank candidates): a `cold_local` share of each batch then explores single-knob mutations of the best config
measured so far (before any measurement: of the configs given to `prioritize`, the task's hand-written default
schedule in a tuning run), the rest is random. The default is usually within 10-20% of the best and good configs
cluster around it; the random part keeps the model's first training data diverse. A model warmed with earlier logs
(transfer) keeps that start: until the task has `warmup` measurements of its own it orders the mutations (all of
them are scored, the best-scored are measured) rather than ranking a pool of random configs, which threw the
default's neighbourhood away and made transfer slower than none. Only earlier workloads of the same operator,
through a template with nearly the same knobs, teach the model (`cost_model.transfer.teaches`); a task unlike them
starts as without them.

One `CostModelHub` is shared by all tasks of a tuning run: a single loop-nest model trains on every task's
measurements (one ranking group per task) plus transfer data from older logs (whose weight fades as the run's own
measurements accumulate), is saved beside the log after each fit (`<log>.xgb.json`), and can be reloaded.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from optuna.distributions import distribution_to_json

from cost_model.features import Featurizer
from cost_model.transfer import WORKLOAD_EVENT, load_transfer_data, teaches, template_of, workload_event
from cost_model.xgb_model import CostModelError, TrainingSet, XGBCostModel, model_path_for_log
from relay_tune.records.database import Database
from relay_tune.records.log_format import comparable_records
from relay_tune.records.measure import MeasureInput, MeasureResult
from relay_tune.tuning.distributed import study_mirror
from relay_tune.tuning.search import (
    FAILURE_VALUE,
    OptunaSearch,
    SearchStrategy,
    StrategyFactory,
    _unvisited_random,
    make_sampler,
    measured_values,
)
from relay_tune.tuning.task import TuneTask
from search_space import Config

if TYPE_CHECKING:
    import optuna


TRANSFER_MATCHES = ("similar", "template", "operator", "any")
SCREEN_MIN_ROWS = 8  # measurements of a task before its knob screener is trained


@dataclass
class HubStats:
    """Where the model's time went (seconds), for overhead reports."""

    fit: float = 0.0
    features: float = 0.0
    predict: float = 0.0
    candidates: float = 0.0
    fits: int = 0
    plans: int = 0
    featurized: int = 0

    @property
    def total(self) -> float:
        return self.fit + self.features + self.predict + self.candidates


@dataclass
class _TaskData:
    task: Any
    measured: dict[str, tuple[Config, float]] = field(default_factory=dict)  # config key -> (config, throughput)


class CostModelHub:
    """The cost model of one tuning run, shared by the searches of all its tasks.

    features: "loopnest" (default; transferable) or "knob". loss: "rank" or "reg". transfer: earlier logs (files or
    folders) whose measurements warm the model. model_path: where the model is saved after each fit (None: not
    saved). initial_model: a saved model to rank with until the first fit (its schema and target must match).
    feature_jobs: worker processes that lower candidates in parallel (they idle otherwise: the builder's workers
    wait while the search plans). fit_threads: XGBoost threads for training and ranking (default 1: its OpenMP threads
    spin-wait for each other, so when another process holds one of the cores a 2-thread fit of 300 rows took 3-5 s
    instead of 0.13 s on one thread; at these data sizes one thread is fast enough). update_rounds: trees added by
    an incremental update between two full fits. transfer_match: which transfer workloads the model trains on:
    "similar" (those whose schedule template is like one a task of the run uses, `cost_model.transfer.teaches`),
    "template" (the same template), "operator" (the same operator) or "any" (all, as before); the others than
    "similar" are kept for the experiments.
    """

    def __init__(
        self,
        *,
        features: str = "loopnest",
        loss: str = "rank",
        transfer: Sequence[str | os.PathLike[str]] = (),
        transfer_tasks: Sequence[Any] = (),
        model_path: str | os.PathLike[str] | None = None,
        initial_model: str | os.PathLike[str] | None = None,
        seed: int = 0,
        transfer_half_life: float = 64.0,
        rounds: int | None = None,
        feature_jobs: int = 1,
        fit_threads: int = 1,
        update_rounds: int = 20,
        transfer_match: str = "similar",
    ) -> None:
        # Paid here, at set-up, rather than by the first fit in the middle of the run (where workers started
        # together all paid it in the same round, on a busy host).
        import xgboost  # noqa: F401  # start-up: importing XGBoost takes 0.3 s of CPU

        self.featurizer = Featurizer(features, jobs=feature_jobs)
        self.fit_threads = fit_threads
        # Knob-feature models of each task (its own measurements only) screen large candidate pools cheaply, so
        # that only a shortlist is lowered for the loop-nest model.
        self.knob_featurizer = Featurizer("knob")
        self.screeners: dict[str, XGBCostModel] = {}
        self._screened_rows: dict[str, int] = {}
        self.loss = loss
        self.seed = seed
        self.model_path = Path(model_path) if model_path is not None else None
        self.transfer_paths = [Path(p) for p in transfer]
        self.transfer_tasks = list(transfer_tasks)
        self.transfer_half_life = transfer_half_life
        self.rounds = rounds
        self._initial_model_path = Path(initial_model) if initial_model is not None else None
        self.model: XGBCostModel | None = None
        self.version = 0  # bumped on every fit or load: searches re-plan when it changes
        self.tasks: dict[str, _TaskData] = {}
        self.transfer: TrainingSet | None = None
        self.transfer_templates: dict[str, str] = {}  # transfer group -> its schedule template (`template_of`)
        if transfer_match not in TRANSFER_MATCHES:
            raise ValueError(f"transfer_match must be one of {', '.join(TRANSFER_MATCHES)}, not {transfer_match!r}")
        self.transfer_match = transfer_match
        self._transfer_loaded = False
        self.stats = HubStats()
        self._rows_at_fit = 0
        self._rows_at_full_fit = 0
        self.update_rounds = update_rounds
        self.target = ""

    # -- registration ------------------------------------------------------------------------------------------

    def register(self, task: Any) -> None:
        if task.key not in self.tasks:
            self.tasks[task.key] = _TaskData(task)
            self.target = self.target or task.target

    def schema(self, task: Any) -> str:
        return self.featurizer.schema(task.space)

    def _transfer_groups(self) -> list[str]:
        """The transfer groups the model trains on: by default those whose schedule template is like one a task
        of this run uses (`cost_model.transfer.teaches`): other operators', or a 1x1 convolution's for a 3x3,
        ordered configs worse than no model in the search-efficiency runs."""
        if self.transfer is None:
            return []
        wanted = {template_of(d.task) for d in self.tasks.values()}
        return [g for g in dict.fromkeys(self.transfer.groups)
                if any(teaches(self.transfer_templates.get(g, ""), w, self.transfer_match) for w in wanted)]

    def transfers_to(self, task: Any) -> bool:
        """True when the model has been taught by earlier logs of a template like this task's."""
        mine = template_of(task)
        return any(teaches(self.transfer_templates.get(g, ""), mine, self.transfer_match)
                   for g in self._transfer_groups())

    def _load_transfer(self, task: Any) -> None:
        if self._transfer_loaded or not self.transfer_paths:
            self._transfer_loaded = True
            return
        self._transfer_loaded = True
        start = time.perf_counter()
        data, report = load_transfer_data(self.transfer_paths, self.featurizer, tasks=self.transfer_tasks,
                                          target=task.target, exclude=[(task.key, task.target)])
        self.stats.features += time.perf_counter() - start
        self.transfer = data
        self.transfer_report = report
        self.transfer_templates = dict(report.templates)
        if data is not None:
            self._fit()

    def _load_initial(self, task: Any) -> None:
        path, self._initial_model_path = self._initial_model_path, None
        if path is None:
            return
        self.model = XGBCostModel.load(path, expect_schema=self.schema(task))
        self.version += 1

    def prepare(self, task: Any) -> None:
        """First use by a task: load transfer data and any initial model (once per hub)."""
        self.register(task)
        self._load_initial(task)
        self._load_transfer(task)

    # -- training ----------------------------------------------------------------------------------------------

    @property
    def measured_rows(self) -> int:
        return sum(len(d.measured) for d in self.tasks.values())

    def should_fit(self, warmup: int, plan_size: int, growth: float, min_new: int) -> bool:
        rows = self.measured_rows
        if rows < warmup or not any(t > 0 for d in self.tasks.values() for _, t in d.measured.values()):
            return False
        if self.model is None or self._rows_at_fit == 0:
            return True
        new = rows - self._rows_at_fit
        return new >= min(plan_size, max(min_new, math.ceil(growth * self._rows_at_fit)))

    def fit(self, full_every: int | None = None) -> None:
        """Train on everything measured: from scratch once `full_every` measurements arrived since the last fit from
        scratch (always when None), else by extending the current trees."""
        self._fit(full_every)

    def _training_set(self) -> TrainingSet | None:
        parts: list[TrainingSet] = []
        weights: dict[str, float] = {}
        for key, data in self.tasks.items():
            if len(data.measured) < 2:
                continue
            items = list(data.measured.values())
            start = time.perf_counter()
            matrix, kept = self.featurizer.many(data.task, [c for c, _ in items])
            self.stats.features += time.perf_counter() - start
            if len(kept) < 2:
                continue
            throughput = np.asarray([items[i][1] for i in kept], dtype=np.float32)
            parts.append(TrainingSet(matrix, throughput, (key,) * len(kept)))
        groups = self._transfer_groups()
        if groups and self.transfer is not None:
            # Older workloads teach the model first; their say fades as this run's own measurements accumulate.
            # Pairs are sampled per row, so a group's pull grows with its size: scale the transfer rows so that
            # together they weigh `decay` times this run's rows (and all of it while there are none).
            used = set(groups)
            keep = np.asarray([g in used for g in self.transfer.groups], dtype=bool)
            transfer = TrainingSet(self.transfer.features[keep], self.transfer.throughput[keep],
                                   tuple(g for g, k in zip(self.transfer.groups, keep) if k))
            own = sum(len(p) for p in parts)
            decay = 0.5 ** (own / self.transfer_half_life)
            share = decay * max(own, 16) / len(transfer)
            for group in groups:
                weights[group] = max(1e-3, share)
            parts.append(transfer)
        if not parts:
            return None
        data = TrainingSet.concat(parts)
        return TrainingSet(data.features, data.throughput, data.groups, weights or None)

    def _fit(self, full_every: int | None = None) -> None:
        data = self._training_set()
        if data is None or len(data) < 2:
            return
        task = next(iter(self.tasks.values())).task if self.tasks else None
        schema = self.schema(task) if task is not None else self.featurizer.schema()
        start = time.perf_counter()
        model = self.model
        full = (model is None or full_every is None or self._rows_at_full_fit == 0
                or self.measured_rows - self._rows_at_full_fit >= full_every
                or model.width != data.features.shape[1] or model.feature_schema != schema)
        if model is not None and not full:
            # Between full fits (every `plan_size` new measurements) the trees are only extended: a few rounds on
            # all the data now, instead of a model from scratch.
            model.update(data, rounds=self.update_rounds)
        else:
            kwargs: dict[str, Any] = {} if self.rounds is None else {"rounds": self.rounds}
            model = XGBCostModel(schema, loss=self.loss, target=self.target, seed=self.seed, nthread=self.fit_threads,
                                 **kwargs)
            model.fit(data)
            self._rows_at_full_fit = self.measured_rows
        self.stats.fit += time.perf_counter() - start
        self.stats.fits += 1
        self.model = model
        self.version += 1
        self._rows_at_fit = self.measured_rows
        if self.model_path is not None:
            model.save(self.model_path)
        if self.featurizer.kind != "knob":
            self._fit_screeners(full)

    def _fit_screeners(self, full: bool = True) -> None:
        for key, data in self.tasks.items():
            items = list(data.measured.values())
            if len(items) < SCREEN_MIN_ROWS or not any(t > 0 for _, t in items):
                continue
            if self._screened_rows.get(key) == len(items):
                continue  # nothing new for this task (other tasks' measurements triggered the fit)
            self._screened_rows[key] = len(items)
            start = time.perf_counter()
            matrix, kept = self.knob_featurizer.many(data.task, [c for c, _ in items])
            throughput = np.asarray([items[i][1] for i in kept], dtype=np.float32)
            rows = TrainingSet(matrix, throughput, (key,) * len(kept))
            screener = self.screeners.get(key)
            if screener is not None and not full:
                screener.update(rows, rounds=max(1, self.update_rounds // 2))  # as the main model: extend
            else:
                screener = XGBCostModel(self.knob_featurizer.schema(data.task.space), loss=self.loss, seed=self.seed,
                                        rounds=60, params={"colsample_bytree": 1.0}, nthread=self.fit_threads)
                screener.fit(rows)
            self.screeners[key] = screener
            self.stats.fit += time.perf_counter() - start

    def screen(self, task: Any, configs: Sequence[Config]) -> tuple[list[Config], np.ndarray] | None:
        """Knob-model scores of configs (cheap: no lowering), or None while the task has no screener."""
        screener = self.screeners.get(task.key)
        if screener is None:
            return None
        start = time.perf_counter()
        matrix, kept = self.knob_featurizer.many(task, configs)
        scores = screener.predict(matrix) if kept else np.zeros(0, dtype=np.float32)
        self.stats.predict += time.perf_counter() - start
        return [configs[i] for i in kept], scores

    # -- scoring -----------------------------------------------------------------------------------------------

    def score(self, task: Any, configs: Sequence[Config]) -> tuple[list[Config], np.ndarray]:
        """The configs that have features, and their predicted scores (higher = faster)."""
        start = time.perf_counter()
        before = self.featurizer.computed
        matrix, kept = self.featurizer.many(task, configs)
        self.stats.featurized += self.featurizer.computed - before
        self.stats.features += time.perf_counter() - start
        if self.model is None or not kept:
            return [configs[i] for i in kept], np.zeros(len(kept), dtype=np.float32)
        start = time.perf_counter()
        scores = self.model.predict(matrix)
        self.stats.predict += time.perf_counter() - start
        return [configs[i] for i in kept], scores


class XGBSearch(OptunaSearch):
    """Cost-model-guided proposals through an Optuna study (see the module docstring).

    plan_size: the most new measurements between two fits. warmup: measurements before the first fit.
    growth / min_new: refit sooner once the data grew by this share (at least min_new new measurements).
    epsilon: share of each batch drawn at random. The candidate pool of a re-plan: pool_random random configs,
    tpe_proposals configs suggested by a private TPE sampler that knows every measurement, single-knob mutations
    of the top_k measured configs, the previous plan's best `keep` entries, and `generations` rounds of mutating
    the `population` best-scoring candidates. Once the task has a knob screener, the whole pool and its
    generations are scored by it, and only the best `shortlist` (plus TPE's proposals) are lowered for the
    loop-nest model; the plan is ordered by both models together. diversity: how much a batch prefers knob values
    it has not picked yet over predicted score (0: the plan's top in order). cold_local: share of each batch
    that mutates the best known config while there is no model yet (0: random until the first fit).
    transfer_local_start: with a model taught by earlier logs, still start around the default until `warmup`
    configs of the task are measured, the model ordering the neighbours (False: the model ranks the whole pool
    from the first batch, as before; kept for the experiments).
    """

    def __init__(
        self,
        task: TuneTask,
        database: Database,
        *,
        hub: CostModelHub | None = None,
        storage: str | os.PathLike[str] | optuna.storages.BaseStorage | None = None,
        seed: int = 0,
        study_name: str | None = None,
        plan_size: int = 32,
        warmup: int = 12,
        growth: float = 0.2,
        min_new: int = 8,
        epsilon: float = 0.15,
        pool_random: int = 64,
        tpe_proposals: int = 6,
        top_k: int = 8,
        keep: int = 64,
        generations: int = 2,
        population: int = 16,
        shortlist: int = 32,
        diversity: float = 1.0,
        cold_local: float = 0.75,
        transfer_local_start: bool = True,
    ) -> None:
        # The study's own sampler only answers asks that find no enqueued plan entry: random is the cheap choice
        # (TPE would re-fit its density estimators on every ask, for a proposal that is then thrown away).
        super().__init__(task, database, storage=storage, sampler="random", seed=seed, study_name=study_name)
        self.name = "xgb"
        self.hub = hub if hub is not None else CostModelHub(seed=seed)
        if not self.hub.featurizer.supports(task):
            warnings.warn(f"task {task.description!r} cannot be lowered without compiling; its search uses knob "
                          f"features and a model of its own", stacklevel=2)
            self.hub = CostModelHub(features="knob", loss=self.hub.loss, seed=seed)
        self.hub.prepare(task)
        self.plan_size = plan_size
        self.warmup = warmup
        self.growth = growth
        self.min_new = min_new
        self.epsilon = epsilon
        self.pool_random = pool_random
        self.tpe_proposals = tpe_proposals
        self.top_k = top_k
        self.keep = keep
        self.generations = generations
        self.population = population
        self.diversity = diversity
        self.shortlist = shortlist
        self.cold_local = cold_local
        self.transfer_local_start = transfer_local_start
        self._anchors: list[Config] = []  # prioritized configs: where the search starts before any measurement
        self._plan: list[tuple[Config, float]] = []
        self._planned: tuple[int, frozenset[str]] = (-1, frozenset())  # (model version, top measured) of the plan
        self._trial_configs: dict[int, tuple[str, Config | None]] = {}
        self._proposer: Any = None  # private TPE study: proposals for the pool, never measured by itself
        self._proposer_known: set[str] = set()
        self._prepared = False  # `prepare` brought the plan up to date for the next proposal
        # On a database that claims configs itself (PostgreSQL), proposals go straight to its claims: the study
        # is not asked, and measurements are mirrored into it afterwards (for optuna-dashboard), outside the
        # budget's claim step. Each Optuna ask on a database costs tens of statements that all workers would wait
        # for; a claim costs one.
        self._direct = self._database_url is not None and hasattr(database, "claimed_keys")
        self._queue: list[Config] = []  # prioritized configs not proposed yet (direct claims)
        self._proposed: dict[str, Config] = {}  # proposed and not yet measured or discarded (direct claims)
        self._own_new = 0  # this worker's measurements since its last refit (direct claims)
        self._describe_workload()

    def _import_log(self) -> None:
        # With direct claims the study mirrors the database's records as they are measured (`_mirror`);
        # importing them as well would show some twice.
        if not (self._database_url is not None and hasattr(self.database, "claimed_keys")):
            super()._import_log()

    def _describe_workload(self) -> None:
        """Record how to rebuild this task in the log, so later runs can learn from its measurements."""
        event = workload_event(self.task)
        if event is None:
            return
        known = getattr(self.database, "events", [])
        if any(e.event == WORKLOAD_EVENT and e.data.get("workload_key") == self.task.key
               and e.data.get("target") == self.task.target for e in known):
            return
        self.database.log_event(event)

    # -- data --------------------------------------------------------------------------------------------------

    def _refresh_measurements(self) -> dict[str, tuple[Config, float]]:
        """Every measurement of this task: the log, and the study's finished trials (all processes)."""
        records = self.database.records(self.task.key, self.task.target)
        comparable = comparable_records(records)
        costs = measured_values(comparable)
        configs = {r.config_key: r.config for r in records}
        # Configs timed only in an older way (see `measured_values`): the study's trials of them carry those times.
        stale = configs.keys() - {r.config_key for r in comparable}
        complete = self._optuna.trial.TrialState.COMPLETE
        # With direct claims every measurement is a record; the study only mirrors them.
        trials = [] if self._direct else self.study.get_trials(deepcopy=False, states=(complete,))
        for trial in trials:
            attrs = trial.user_attrs
            key = attrs.get("config_key")
            if not isinstance(key, str) or "answered_from" in attrs or trial.value is None or key in stale:
                continue
            if key not in configs:
                config = self._config_of(trial)
                if config is None:
                    continue
                configs[key] = config
            value = float(trial.value)
            if key not in costs or value < costs[key]:
                costs[key] = value
        measured = {key: (configs[key], (1.0 / cost if 0 < cost < FAILURE_VALUE else 0.0))
                    for key, cost in costs.items() if key in configs}
        self.hub.tasks[self.task.key].measured = measured
        return measured

    def _config_of(self, trial: Any) -> Config | None:
        held = self._trial_configs.get(trial.number)
        if held is not None:
            return held[1]
        try:
            config: Config | None = self.task.space.to_optuna(self._optuna.trial.FixedTrial(trial.params))
        except (ValueError, KeyError, TypeError):
            config = None  # params of an older space
        self._trial_configs[trial.number] = (trial.user_attrs.get("config_key", ""), config)
        return config

    # -- the candidate pool ------------------------------------------------------------------------------------

    def _visited(self, measured: dict[str, tuple[Config, float]]) -> set[str]:
        if self._direct:
            claimed = self.database.claimed_keys(self.task.key, self.task.target)  # type: ignore[attr-defined]
            return set(measured) | claimed | set(self._proposed)
        return set(measured) | set(self._claims()) | set(self._pending)

    def _tpe_proposals(self, measured: dict[str, tuple[Config, float]], visited: set[str]) -> list[Config]:
        """Configs a TPE sampler fed with every measurement would try next (it measures nothing itself)."""
        if self.tpe_proposals <= 0:
            return []

        optuna = self._optuna
        if self._proposer is None:
            self._proposer = optuna.create_study(sampler=make_sampler("tpe", self._seed), direction="minimize")
        space = self.task.space
        fresh = []
        for key, (config, throughput) in measured.items():
            if key in self._proposer_known or not space.is_valid(config):
                continue
            self._proposer_known.add(key)
            fresh.append(optuna.trial.create_trial(
                params=space.to_params(config), distributions=self._distributions,
                value=1.0 / throughput if throughput > 0 else FAILURE_VALUE))
        if fresh:
            self._proposer.add_trials(fresh)
        found: list[Config] = []
        asked = []
        for _ in range(self.tpe_proposals):
            trial = self._proposer.ask()
            asked.append(trial)
            config = space.to_optuna(trial)
            if config.key not in visited and space.is_valid(config):
                found.append(config)
        for trial in asked:  # failed trials are invisible to TPE's estimators
            self._proposer.tell(trial, state=optuna.trial.TrialState.FAIL)
        return found

    def _candidates(self, measured: dict[str, tuple[Config, float]], visited: set[str],
                    random_count: int) -> list[Config]:
        """The previous plan's best, mutations of the best measured configs, then random configs."""
        space = self.task.space
        found: dict[str, Config] = {}
        for config, _ in self._plan[: self.keep]:  # the previous plan's best compete again under the new model
            if config.key not in visited:
                found.setdefault(config.key, config)
        best = sorted((item for item in measured.values() if item[1] > 0), key=lambda item: -item[1])[: self.top_k]
        for config, _ in best:
            for mutant in self._mutations(config):
                if mutant.key not in visited:
                    found.setdefault(mutant.key, mutant)
        for _ in range(random_count):
            config = space.sample(self._rng)
            if config.key not in visited:
                found.setdefault(config.key, config)
        return list(found.values())

    def _mutations(self, config: Config, shuffled: bool = False) -> list[Config]:
        """Single-knob changes of `config`: every one-step neighbour (in random order when `shuffled`), and one
        random value per knob (a jump, so a tile size two candidates away is reachable without passing through a
        worse one)."""
        space = self.task.space
        if not space.is_valid(config):
            return []
        found = space.neighbors(config, self._rng if shuffled else None)
        for knob in space.knobs:
            value = knob.sample(self._rng)
            if value != config[knob.name]:
                mutant = config.replace(**{knob.name: value})
                if space.is_valid(mutant):
                    found.append(mutant)
        return found

    def _replan(self, measured: dict[str, tuple[Config, float]]) -> None:
        start = time.perf_counter()
        visited = self._visited(measured)
        tpe = self._tpe_proposals(measured, visited)
        screening = self.task.key in self.hub.screeners
        # Without a screener (a model from transfer data or a loaded file, little of this task measured) every
        # candidate is lowered: a smaller pool, and one generation of mutating the loop-nest model's favourites.
        pool = self._candidates(measured, visited, self.pool_random if screening else self.pool_random // 3)
        self.hub.stats.candidates += time.perf_counter() - start
        screened = self.hub.screen(self.task, pool) if screening else None
        if screened is None:
            shortlist = pool
            generations, population = min(1, self.generations), max(1, self.population // 2)
        else:
            ranked = self._evolve(dict(zip((c.key for c in screened[0]), zip(*screened))), visited)
            shortlist = [c for c, _ in ranked[: self.shortlist]]
            generations = 0
            population = 0
        keys = {c.key for c in shortlist}
        shortlist += [c for c in tpe if c.key not in keys]  # TPE's ideas always reach the loop-nest model
        configs, scores = self.hub.score(self.task, shortlist)
        scored = dict(zip((c.key for c in configs), zip(configs, scores.tolist())))
        for _ in range(generations):
            parents = sorted(scored.values(), key=lambda item: -item[1])[:population]
            children = self._children(parents, visited, scored)
            if not children:
                break
            configs, scores = self.hub.score(self.task, children)
            scored.update(zip((c.key for c in configs), zip(configs, scores.tolist())))
        plan = list(scored.values())
        if screened is not None and len(plan) > 1:
            # the final order: the loop-nest model and this task's knob model, standardised and averaged
            _, knob = self.hub.screen(self.task, [c for c, _ in plan]) or ([], np.zeros(len(plan)))
            nest = np.asarray([s for _, s in plan], dtype=np.float64)
            combined = _standardised(nest) + _standardised(np.asarray(knob, dtype=np.float64))
            plan = [(c, float(v)) for (c, _), v in zip(plan, combined)]
        self._plan = sorted(plan, key=lambda item: -item[1])
        self._planned = (self.hub.version, self._leaders(measured))
        self.hub.stats.plans += 1

    def _children(self, parents: list[tuple[Config, float]], visited: set[str],
                  known: dict[str, tuple[Config, float]]) -> list[Config]:
        start = time.perf_counter()
        children: dict[str, Config] = {}
        for config, _ in parents:
            for child in self._mutations(config):
                if child.key not in visited and child.key not in known:
                    children.setdefault(child.key, child)
        self.hub.stats.candidates += time.perf_counter() - start
        return list(children.values())

    def _evolve(self, scored: dict[str, tuple[Config, float]], visited: set[str]) -> list[tuple[Config, float]]:
        """Generations of mutating the best knob-screened candidates (scores from the cheap screener)."""
        for _ in range(self.generations):
            parents = sorted(scored.values(), key=lambda item: -item[1])[: self.population]
            children = self._children(parents, visited, scored)
            if not children:
                break
            screened = self.hub.screen(self.task, children)
            if screened is None:
                break
            scored.update(zip((c.key for c in screened[0]), zip(*screened)))
        return sorted(scored.values(), key=lambda item: -item[1])

    # -- proposing ---------------------------------------------------------------------------------------------

    def prioritize(self, configs: Sequence[Config]) -> None:
        if self._direct:
            self._queue.extend(c for c in configs if self.task.space.is_valid(c))
        else:
            super().prioritize(configs)
        self._anchors.extend(c for c in configs if self.task.space.is_valid(c))

    def _cold_local(self, measured: dict[str, tuple[Config, float]], visited: set[str], n: int,
                    ranked: bool = False) -> list[Config]:
        """Up to n unvisited single-knob mutations of the best measured config (or of the prioritized configs while
        none has run): one-step neighbours first, in random order, then random jumps of one knob. `ranked`: all of
        them, ordered by the (transferred) model's scores instead."""
        ran = [item for item in measured.values() if item[1] > 0]
        anchors = [max(ran, key=lambda item: item[1])[0]] if ran else self._anchors
        chosen: dict[str, Config] = {}
        for anchor in anchors:
            for mutant in self._mutations(anchor, shuffled=True):
                if len(chosen) >= n and not ranked:
                    return list(chosen.values())
                if mutant.key not in visited:
                    chosen.setdefault(mutant.key, mutant)
        if not ranked or len(chosen) <= n:
            return list(chosen.values())[:n]
        configs, scores = self.hub.score(self.task, list(chosen.values()))
        order = np.argsort(-scores, kind="stable")
        return [configs[i] for i in order[:n]]

    def prepare(self, n: int) -> None:
        measured = self._refresh_measurements()
        self._prepared = True
        if self._direct and self.hub.model is not None and self._own_new < self.min_new and len(self._plan) >= 2 * n:
            # Workers sharing a database see the measurements grow W times faster than each one measures; a refit
            # and re-plan on every growth step would make each worker's CPU per trial grow with W. Each one
            # refits after `min_new` measurements of its own instead (on everything measured so far).
            return
        self._update_plan(measured, n)
        self._own_new = 0

    def _update_plan(self, measured: dict[str, tuple[Config, float]], n: int) -> None:
        if self.hub.should_fit(self.warmup, self.plan_size, self.growth, self.min_new):
            self.hub.fit(full_every=self.plan_size)
        # Re-plan after a refit, when a newly measured config joined the best (it has new neighbours), and when the
        # plan runs dry.
        if self.hub.model is not None and (self._planned != (self.hub.version, self._leaders(measured))
                                           or len(self._plan) < 2 * n):
            self._replan(measured)

    def _choose(self, n: int) -> list[Config]:
        measured = self._refresh_measurements()
        if not self._prepared or len(self._plan) < n:
            # After `prepare` the plan stands for this round, even if other workers' results arrived meanwhile:
            # re-ranking here would happen under the claim lock, where other workers wait.
            self._update_plan(measured, n)
        self._prepared = False
        visited = self._visited(measured)
        chosen: list[Config] = []
        # A model taught only by earlier logs (and fewer than `warmup` measurements of this task) does not replace
        # the local start around the default: it orders the default's neighbours instead. Ranking a random pool
        # with it made transfer slower than no transfer (21 trials to 95% on dense 1024^3 instead of 4).
        cold = self.hub.model is None or (self.transfer_local_start and self.hub.transfer is not None
                                          and len(measured) < self.warmup)
        explore = 0 if cold else round(self.epsilon * n)
        if not cold and explore == 0 and n >= 4 and self.epsilon > 0:
            explore = 1
        if cold:
            ranked = self.hub.model is not None and self.hub.transfers_to(self.task)
            chosen += self._cold_local(measured, visited, round(self.cold_local * n), ranked=ranked)
        else:
            chosen += self._diverse_top(n - explore, visited)
        visited.update(c.key for c in chosen)
        while len(chosen) < n:
            config = _unvisited_random(self.task, visited, self._rng)
            if config is None:
                break
            chosen.append(config)
            visited.add(config.key)
        return chosen

    def _leaders(self, measured: dict[str, tuple[Config, float]]) -> frozenset[str]:
        """Keys of the top_k measured configs: the ones whose mutations the pool holds."""
        ranked = sorted((item for item in measured.items() if item[1][1] > 0), key=lambda item: -item[1][1])
        return frozenset(key for key, _ in ranked[: self.top_k])

    def _diverse_top(self, n: int, visited: set[str]) -> list[Config]:
        """Up to n configs from the head of the plan: high predicted scores, spread over different knob values.

        The best-scoring candidates are often near-copies of one config (the model cannot tell their small
        differences apart), and measuring eight of them teaches little. Like AutoTVM's diversity filter, each pick
        maximises its standardised score plus `diversity` times the share of its knob values that no earlier pick
        of the batch has.
        """
        self._plan = [(c, s) for c, s in self._plan if c.key not in visited]
        window = self._plan[: max(4 * n, 16)]
        if not window or n <= 0:
            return []
        scores = np.asarray([s for _, s in window], dtype=np.float64)
        spread = scores.std()
        z = (scores - scores.mean()) / spread if spread > 0 else np.zeros_like(scores)
        names = self.task.space.names
        covered: set[tuple[str, str]] = set()
        picked: list[int] = []
        for _ in range(min(n, len(window))):
            best, best_gain = -1, -math.inf
            for i, (config, _) in enumerate(window):
                if i in picked:
                    continue
                novel = sum(1 for name in names if (name, repr(config[name])) not in covered) / max(1, len(names))
                gain = z[i] + self.diversity * novel
                if gain > best_gain:
                    best, best_gain = i, gain
            picked.append(best)
            covered.update((name, repr(window[best][0][name])) for name in names)
        chosen = [window[i][0] for i in picked]
        taken = {c.key for c in chosen}
        self._plan = [(c, s) for c, s in self._plan if c.key not in taken]
        return chosen

    def _propose_once(self, n: int) -> tuple[list[Config], int]:
        if n <= 0:
            return [], 0
        if self._direct:
            measured = self._refresh_measurements()
            visited = self._visited(measured)
            chosen = [c for c in self._queue if c.key not in visited][:n]
            self._queue = [c for c in self._queue if c not in chosen and c.key not in visited]
            chosen += self._choose(n - len(chosen)) if len(chosen) < n else []
            self._proposed.update((c.key, c) for c in chosen)
            return chosen, len(chosen)
        with self._claiming():
            waiting = self.study.get_trials(deepcopy=False, states=(self._optuna.trial.TrialState.WAITING,))
            for config in self._choose(max(0, n - len(waiting))):
                self.study.enqueue_trial(self.task.space.to_params(config))
            return self._propose_claimed(n)

    def discard(self, configs: Sequence[Config]) -> None:
        if not self._direct:
            super().discard(configs)
            return
        for config in configs:
            self._proposed.pop(config.key, None)

    def update(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        if self._direct:
            self._mirror(inputs, results)
        else:
            super().update(inputs, results)
        data = self.hub.tasks[self.task.key].measured
        for measure_input, result in zip(inputs, results, strict=True):
            cost = result.cost
            data[measure_input.config.key] = (measure_input.config, 1.0 / cost if result.ok and cost else 0.0)


    def _mirror(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        """Add the round's measurements to the study as finished trials (what optuna-dashboard shows), in the
        background: this worker measures its next round meanwhile."""
        self._own_new += len(inputs)
        trials = []
        for measure_input, result in zip(inputs, results, strict=True):
            config = self._proposed.pop(measure_input.config.key, measure_input.config)
            attrs: dict[str, Any] = {"config_key": config.key, "worker": self._worker}
            if not result.ok and result.error_kind is not None:
                attrs["error_kind"] = result.error_kind.name
            params = {name: (self._distributions[name].to_internal_repr(value),
                             distribution_to_json(self._distributions[name]))
                      for name, value in self.task.space.to_params(config).items()}
            value = result.cost if result.ok and result.cost is not None else FAILURE_VALUE
            trials.append((params, float(value), attrs))
        if trials and self._database_url is not None:
            study_mirror(self._database_url).put(self.study._study_id, trials)

    def close(self) -> None:
        super().close()
        if self._direct and self._database_url is not None:
            study_mirror(self._database_url).flush()


def _standardised(values: np.ndarray) -> np.ndarray:
    spread = values.std()
    return (values - values.mean()) / spread if spread > 0 else np.zeros_like(values)


def xgb_search(
    storage: str | os.PathLike[str] | optuna.storages.BaseStorage | None = None,
    *,
    seed: int = 0,
    log_path: str | os.PathLike[str] | None = None,
    transfer_from: Sequence[str | os.PathLike[str]] = (),
    transfer_tasks: Sequence[Any] = (),
    features: str = "loopnest",
    loss: str = "rank",
    initial_model: str | os.PathLike[str] | None = None,
    hub: CostModelHub | None = None,
    feature_jobs: int | None = None,
    transfer_match: str = "similar",
    transfer_half_life: float = 64.0,
    **options: Any,
) -> StrategyFactory:
    """A factory of `XGBSearch`es sharing one `CostModelHub` (one model for all tasks of the run).

    log_path: the tuning log; the model is saved beside it (`<log>.xgb.json`). transfer_from: earlier logs (or
    folders of logs) to warm the model with. feature_jobs: processes lowering candidates (default: up to 2).
    options: `XGBSearch` keyword arguments (plan_size, epsilon, ...).
    """
    jobs = feature_jobs if feature_jobs is not None else min(2, os.cpu_count() or 1)
    shared = hub or CostModelHub(
        features=features, loss=loss, transfer=transfer_from, transfer_tasks=transfer_tasks, seed=seed,
        model_path=model_path_for_log(log_path) if log_path is not None else None, initial_model=initial_model,
        feature_jobs=jobs, transfer_match=transfer_match, transfer_half_life=transfer_half_life)

    def make(task: TuneTask, database: Database) -> SearchStrategy:
        return XGBSearch(task, database, hub=shared, storage=storage, seed=seed, **options)

    make.hub = shared  # type: ignore[attr-defined]
    return make


__all__ = ["CostModelError", "CostModelHub", "HubStats", "XGBSearch", "xgb_search"]
