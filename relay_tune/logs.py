"""Reading and maintaining tuning logs (JSON lines).

    >>> from relay_tune import logs
    >>> frame = logs.load(["logs/model.jsonl"])           # one row per measured candidate
    >>> frame = logs.load("logs/*.jsonl")                 # glob patterns and folders work too
    >>> logs.merge(["a.jsonl", "b.jsonl"], "all.jsonl")   # never in place
    >>> logs.distill(["all.jsonl"], "best.jsonl", top=1)  # the best record per workload and target
"""

from relay_tune.records.database import apply_best
from relay_tune.records.log_format import expand_log_paths, read_events, read_records
from relay_tune.records.tables import COLUMNS, distill, load, merge

__all__ = ["COLUMNS", "apply_best", "distill", "expand_log_paths", "load", "merge", "read_events", "read_records"]
