"""The record store: measurement results, tuning records and their JSON-lines log, databases over logs, logs as
tables, and the per-user tuning cache.

It sits below the model compiler (which reads the best records back), the runtime profiler (logged times beside
measured ones), the cost model (transfer learning from earlier logs) and the tuner (which writes the records).

- `measure`: `MeasureInput`, `BuildResult`, `RunResult`, `MeasureResult` and the error kinds;
- `log_format`: `TuningRecord`, `LogEvent`, reading and appending JSON-lines logs;
- `database`: `Database` and its JSON-lines and in-memory forms, `top_k`, `apply_best`, `best_for_target`;
- `tables`: logs as pandas tables, `merge` and `distill` (public as `relay_tune.logs`);
- `cache`: the per-user tuning cache.
"""
