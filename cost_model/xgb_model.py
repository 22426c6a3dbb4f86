"""`XGBCostModel`: gradient-boosted trees that rank candidate schedules by predicted throughput.

Training data is a set of measured configs, each with a feature vector, its throughput and the workload it belongs
to. Throughputs are normalised per workload (divided by that workload's best), so workloads of very different
speeds train one model; failed measurements count as the worst (0). Two objectives:

* "rank" (default): XGBoost's `rank:pairwise`, with one query group per workload, so only the order of candidates
  *within* a workload is learnt. Only the ranking matters for picking the next configs to measure, as the AutoTVM
  paper argues; it also makes pooling workloads of different speeds harmless.
* "reg": squared-error regression of the normalised throughput (AutoTVM's "reg").

The model is stored in XGBoost's own JSON format (never pickle), with attributes recording the feature schema,
the number of features, the objective and the target, and loading refuses a model whose schema or target does not
match what the caller computes (a mismatched model would silently rank nonsense).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from relay_tune.errors import RelayTuneError

MODEL_FORMAT = "relay-tune-xgb-cost-model-v1"
LOSSES = ("rank", "reg")

# Small, shallow trees: at tuning-run sizes (50-300 rows of ~700 loop-nest features) depth 4 with 80 rounds ranked
# held-out configs as well as depth 6 with 120 rounds (Spearman 0.77 vs 0.76 at 50 rows, 0.84 vs 0.81 at 150) and
# trained 3x faster (100 vs 310 ms for 150 rows); AutoTVM uses depth 3, MetaSchedule depth 10 on far more data.
DEFAULT_PARAMS: dict[str, Any] = {
    "max_depth": 4,
    "eta": 0.2,
    "gamma": 1e-4,
    "min_child_weight": 0.5,
    "subsample": 1.0,
    "colsample_bytree": 0.7,
    "lambda": 1.0,
    "alpha": 0.0,
    "max_bin": 64,
    "tree_method": "hist",
}
DEFAULT_ROUNDS = 80


class CostModelError(RelayTuneError):
    """A cost model file that cannot be used: unreadable, or made for other features or another target."""


@dataclass(frozen=True)
class TrainingSet:
    """Measured configs as a feature matrix with normalised labels and one group id per row.

    `features`: (n, width) float32; `throughput`: raw throughputs (1 / seconds, 0 for failures);
    `groups`: workload names, one per row; `weights`: optional per-group weights (group name -> weight).
    """

    features: np.ndarray
    throughput: np.ndarray
    groups: tuple[str, ...]
    weights: dict[str, float] | None = None

    def __post_init__(self) -> None:
        n = len(self.groups)
        if self.features.ndim != 2 or self.features.shape[0] != n or self.throughput.shape != (n,):
            raise ValueError(f"training set shapes disagree: features {self.features.shape}, "
                             f"throughput {self.throughput.shape}, {n} group ids")

    def __len__(self) -> int:
        return len(self.groups)

    @staticmethod
    def concat(parts: Sequence[TrainingSet]) -> TrainingSet:
        parts = [p for p in parts if len(p)]
        if not parts:
            raise ValueError("no training data")
        widths = {p.features.shape[1] for p in parts}
        if len(widths) != 1:
            raise CostModelError(f"training sets have different feature widths {sorted(widths)}")
        weights: dict[str, float] = {}
        for p in parts:
            weights.update(p.weights or {})
        return TrainingSet(np.concatenate([p.features for p in parts]), np.concatenate([p.throughput for p in parts]),
                           tuple(g for p in parts for g in p.groups), weights or None)

    def normalised_labels(self) -> np.ndarray:
        """Throughput divided by the best of its group (failures and groups with no success: 0)."""
        labels = np.zeros(len(self), dtype=np.float32)
        groups = np.asarray(self.groups)
        for name in dict.fromkeys(self.groups):
            rows = groups == name
            best = float(self.throughput[rows].max(initial=0.0))
            if best > 0:
                labels[rows] = self.throughput[rows] / best
        return labels


class XGBCostModel:
    """Predicts a score per candidate; higher means faster. See the module docstring."""

    def __init__(
        self,
        feature_schema: str,
        *,
        loss: str = "rank",
        target: str = "",
        rounds: int = DEFAULT_ROUNDS,
        params: dict[str, Any] | None = None,
        seed: int = 0,
        nthread: int = 1,
    ) -> None:
        if loss not in LOSSES:
            raise ValueError(f"unknown loss {loss!r}; expected one of {LOSSES}")
        self.feature_schema = feature_schema
        self.loss = loss
        self.target = target
        self.rounds = rounds
        self.params = {**DEFAULT_PARAMS, **(params or {})}
        self.seed = seed
        self.nthread = nthread
        self.width: int | None = None
        self.booster: Any = None
        self.fits = 0
        self.fit_seconds = 0.0
        self.predict_seconds = 0.0
        self.trained_rows = 0

    @property
    def fitted(self) -> bool:
        return self.booster is not None

    def _xgb_params(self) -> dict[str, Any]:
        params = dict(self.params)
        params.update(seed=self.seed, nthread=self.nthread, verbosity=0)
        if self.loss == "rank":
            # "mean": sample pairs uniformly within each workload (the top-k scheme is for graded search results)
            params.update(objective="rank:pairwise", lambdarank_pair_method="mean",
                          lambdarank_num_pair_per_sample=8, eval_metric="ndcg")
        else:
            params.update(objective="reg:squarederror", eval_metric="rmse")
        return params

    def fit(self, data: TrainingSet) -> XGBCostModel:
        """Train from scratch on `data` (needs at least two rows)."""
        self.booster = None
        return self._train(data, self.rounds)

    def update(self, data: TrainingSet, rounds: int = 20) -> XGBCostModel:
        """Incremental training: `rounds` more trees fitted to what the current trees get wrong on `data` (the
        old rows plus the new ones), a fraction of the cost of a fit from scratch. A model never trained is fitted."""
        if self.booster is None:
            return self.fit(data)
        return self._train(data, rounds)

    def _train(self, data: TrainingSet, rounds: int) -> XGBCostModel:
        # start-up: xgboost takes ~0.3 s to import; only fitting and ranking need it, not features or logs
        import xgboost as xgb

        if len(data) < 2:
            raise ValueError("a cost model needs at least two measured configs to train")
        self._check_width(data.features.shape[1])
        start = time.perf_counter()
        order = np.argsort(np.asarray([_group_index(data.groups)[g] for g in data.groups]), kind="stable")
        features = data.features[order]
        labels = data.normalised_labels()[order]
        groups = [data.groups[i] for i in order]
        index = _group_index(groups)
        qid = np.asarray([index[g] for g in groups], dtype=np.uint32)
        matrix = xgb.DMatrix(features, label=labels, qid=qid if self.loss == "rank" else None, nthread=self.nthread)
        if data.weights:
            per_group = [float(data.weights.get(g, 1.0)) for g in index]
            if self.loss == "rank":
                matrix.set_weight(np.asarray(per_group, dtype=np.float32))  # ranking weights are per group
            else:
                matrix.set_weight(np.asarray([per_group[q] for q in qid], dtype=np.float32))
        self.booster = xgb.train(self._xgb_params(), matrix, num_boost_round=rounds, xgb_model=self.booster)
        self.width = features.shape[1]
        self.fits += 1
        self.trained_rows = len(data)
        self.booster.set_attr(**self._attributes())
        self.fit_seconds += time.perf_counter() - start
        return self

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Scores for rows of features (higher = faster). Only the order of scores within a workload matters."""
        # start-up: xgboost takes ~0.3 s to import; only fitting and ranking need it, not features or logs
        import xgboost as xgb

        if self.booster is None:
            raise CostModelError("the cost model has not been trained or loaded")
        if features.ndim != 2:
            raise ValueError("predict takes a 2-D feature matrix")
        if len(features) == 0:
            return np.zeros(0, dtype=np.float32)
        self._check_width(features.shape[1])
        start = time.perf_counter()
        scores = self.booster.predict(xgb.DMatrix(features, nthread=self.nthread))
        self.predict_seconds += time.perf_counter() - start
        return np.asarray(scores, dtype=np.float32)

    def _check_width(self, width: int) -> None:
        if self.width is not None and width != self.width:
            raise CostModelError(f"the cost model takes {self.width} features per config, got {width}")

    # -- persistence ---------------------------------------------------------------------------------------------

    def _attributes(self) -> dict[str, str]:
        return {
            "relay_tune_format": MODEL_FORMAT,
            "feature_schema": self.feature_schema,
            "feature_width": str(self.width),
            "loss": self.loss,
            "target": self.target,
            "trained_rows": str(self.trained_rows),
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the model as XGBoost JSON (atomically: a reader never sees half a file)."""
        if self.booster is None:
            raise CostModelError("cannot save a cost model that has not been trained")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp.json")
        os.close(handle)
        try:
            self.booster.save_model(tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return path

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        expect_schema: str | None = None,
        expect_target: str | None = None,
        nthread: int = 1,
    ) -> XGBCostModel:
        """Read a model saved by `save`; refuse one made for other features or (when given) another target."""
        # start-up: xgboost takes ~0.3 s to import; only fitting and ranking need it, not features or logs
        import xgboost as xgb

        path = Path(path)
        try:
            text = path.read_text()
            json.loads(text)  # a clear error for a torn or foreign file before XGBoost's own
            booster = xgb.Booster(params={"nthread": nthread}, model_file=str(path))
        except (OSError, ValueError, xgb.core.XGBoostError) as err:
            raise CostModelError(f"cannot read cost model {path}: {err}") from err
        attrs = {k: v for k, v in booster.attributes().items() if v is not None}
        if attrs.get("relay_tune_format") != MODEL_FORMAT:
            raise CostModelError(f"{path} is not a relay-tune cost model (format {attrs.get('relay_tune_format')!r})")
        schema = attrs.get("feature_schema", "")
        if expect_schema is not None and schema != expect_schema:
            raise CostModelError(f"cost model {path} was trained on features {schema!r}, but this run computes "
                                 f"{expect_schema!r}; retrain it (e.g. from its tuning logs with --transfer-from)")
        target = attrs.get("target", "")
        if expect_target is not None and target != expect_target:
            raise CostModelError(f"cost model {path} was trained for target {target!r}, not {expect_target!r}")
        model = cls(schema, loss=attrs.get("loss", "rank"), target=target, nthread=nthread)
        model.booster = booster
        model.width = int(attrs["feature_width"]) if attrs.get("feature_width", "None") != "None" else None
        model.trained_rows = int(attrs.get("trained_rows", "0"))
        return model


def _group_index(groups: Sequence[str]) -> dict[str, int]:
    return {g: i for i, g in enumerate(dict.fromkeys(groups))}


def model_path_for_log(log_path: str | os.PathLike[str]) -> Path:
    """logs/model.jsonl -> logs/model.jsonl.xgb.json (the cost model saved beside its log)."""
    path = Path(log_path)
    return path.with_name(path.name + ".xgb.json")


def recall_at_k(scores: np.ndarray, throughput: np.ndarray, k: int) -> float:
    """Fraction of the true top-k (by throughput) among the predicted top-k: how well a model picks winners."""
    k = min(k, len(scores))
    if k == 0:
        return 0.0
    predicted = set(np.argsort(-scores, kind="stable")[:k].tolist())
    actual = set(np.argsort(-throughput, kind="stable")[:k].tolist())
    return len(predicted & actual) / k


__all__ = [
    "DEFAULT_PARAMS",
    "LOSSES",
    "MODEL_FORMAT",
    "CostModelError",
    "TrainingSet",
    "XGBCostModel",
    "model_path_for_log",
    "recall_at_k",
]
