"""The cost model: features of candidate schedules and an XGBoost model that ranks them.

- `cost_model.features`: fixed-length loop-nest features of a lowered kernel (`loop_nest_features`), knob-value
  features (`knob_features`), and `Featurizer` (cached, optionally parallel, per (task, config)).
- `cost_model.xgb_model`: `XGBCostModel` (rank:pairwise or regression on throughput normalised per workload,
  saved as XGBoost JSON with its feature schema and target) and `TrainingSet`.
- `cost_model.transfer`: `load_transfer_data` re-lowers the configs of earlier tuning logs (tasks rebuilt from
  their `workload` events) into a training set of other workloads.

Features describe the loop nests of the model tuner's own templates (`search_space.cpu`); single-operator tasks
for benchmarks and tests are in `relay_tune.tuning.operator_tasks`.

The model-guided search that uses all of this is `relay_tune.tuning.xgb_search`.
"""

from cost_model.features import (
    LOOP_NEST_SCHEMA,
    LOOP_NEST_WIDTH,
    Featurizer,
    knob_features,
    loop_nest_feature_names,
    loop_nest_features,
)
from cost_model.transfer import load_transfer_data, register_workload_kind
from cost_model.xgb_model import CostModelError, TrainingSet, XGBCostModel, model_path_for_log

__all__ = [
    "LOOP_NEST_SCHEMA",
    "LOOP_NEST_WIDTH",
    "CostModelError",
    "Featurizer",
    "TrainingSet",
    "XGBCostModel",
    "knob_features",
    "load_transfer_data",
    "loop_nest_feature_names",
    "loop_nest_features",
    "model_path_for_log",
    "register_workload_kind",
]
