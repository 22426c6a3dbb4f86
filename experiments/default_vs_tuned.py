"""Per task of a model: the default schedule against the best config a tuning log found, timed side by side.

    relay-tune MODEL --trials 1000 --log LOG                     # tune first (or pass --trials here)
    python experiments/default_vs_tuned.py MODEL --log LOG [--rounds 5] [--csv out.csv]

For every task of the model (on this machine, `--target`), the task's default config and the best config the log
holds for it are built and then timed in interleaved rounds (default, best, default, best, ...) with the tuner's
own runner (process-isolated, outputs checked against the numpy interpreter); each is valued at the median of its
rounds, so both sides of a ratio see the same machine load. A best config whose loop nest is the default's (a knob
that changes nothing for this workload) counts as the default. Prints per task: default ms, the log's best
config's ms, best ms (the faster of the two: the default is a point of the space too) and default / best, and
writes the same table as CSV (`--csv`, default experiments/results/default_vs_tuned/<model>.csv). The "default" is
whatever the code on PYTHONPATH calls the default (run it against another checkout to compare versions).

`--compare-with CHECKOUT` also times the default config that another checkout's rule picks (read from a child
process with that checkout on PYTHONPATH; the config is built and timed by this checkout's templates, which must
be the same), interleaved with the other two in the same rounds: a before/after of a default rule in one run.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path
from typing import Any


def _best_configs(log: Path, target: str) -> dict[str, Any]:
    """The config of the fastest valid record of each workload in `log` for `target`."""
    from relay_tune.tuning import read_records

    best: dict[str, tuple[float, Any]] = {}
    for record in read_records(log):
        if record.target != target or not record.ok or record.mean_cost is None:
            continue
        cost = float(record.mean_cost)
        if record.workload_key not in best or cost < best[record.workload_key][0]:
            best[record.workload_key] = (cost, record.config)
    return {key: config for key, (_, config) in best.items()}


def _same_nest(task: Any, a: Any, b: Any) -> bool:
    from relay_tune.kernel import analysis

    try:
        return analysis.format_func(task.lower(a)) == analysis.format_func(task.lower(b))
    except Exception:  # a config the task cannot lower: time it and let the runner report it
        return False


_OTHER_DEFAULTS = """
import json, sys
try:
    from relay_tune.compile import resolve_target
except ImportError:  # a checkout from before the compiler module had its name
    from relay_tune.build import resolve_target
from relay_tune.cli import load_model
from relay_tune.tuning.relay_task import tasks_from_module
tasks = tasks_from_module(load_model(sys.argv[1]), resolve_target(sys.argv[2]))
print(json.dumps({t.key: dict(t.default_config()) for t in tasks}))
"""


def _other_defaults(checkout: str, model: str, target: str) -> dict[str, Any]:
    """Each task's default config as the code of `checkout` picks it (key -> config)."""
    import json
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(Path(checkout).resolve())}
    done = subprocess.run([sys.executable, "-c", _OTHER_DEFAULTS, model, target], env=env, capture_output=True,
                          text=True, check=True, cwd=checkout)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _time(runner: Any, task: Any, artifacts: list[Any], rounds: int) -> list[float | None]:
    """Median seconds of each artifact over `rounds` interleaved rounds (None: it failed)."""
    samples: list[list[float]] = [[] for _ in artifacts]
    for _ in range(rounds):
        for i, artifact in enumerate(artifacts):
            if artifact is None:
                continue
            result = runner.run(task, artifact)
            if result.costs:
                samples[i].append(statistics.median(result.costs))
    return [statistics.median(s) if s else None for s in samples]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="Relay text (.relay) or ONNX model")
    parser.add_argument("--log", required=True, help="tuning log to take the best configs from")
    parser.add_argument("--target", default="llvm", help="target (default: this machine)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per task (default 5)")
    parser.add_argument("--trials", type=int, default=0, help="tune the model into --log first (relay-tune)")
    parser.add_argument("--csv", help="where to write the table")
    parser.add_argument("--compare-with", metavar="CHECKOUT",
                        help="also time the default config another checkout's rule picks (e.g. the main branch)")
    parser.add_argument("--changed-only", action="store_true",
                        help="with --compare-with: only the tasks whose two default configs differ")
    args = parser.parse_args(argv)

    from relay_tune.cli import load_model
    from relay_tune.compile import resolve_target
    from relay_tune.tuning import InlineBuilder, LocalRunner
    from relay_tune.tuning.relay_task import tasks_from_module

    if args.trials:
        from relay_tune.cli import main as cli_main

        code = cli_main([args.model, "--trials", str(args.trials), "--log", args.log, "--target", args.target])
        if code:
            return int(code)
    target = resolve_target(args.target)
    tasks = tasks_from_module(load_model(args.model), target)
    best = _best_configs(Path(args.log), target.log_name)
    others = _other_defaults(args.compare_with, str(Path(args.model).resolve()), args.target) \
        if args.compare_with else {}
    builder = InlineBuilder()
    runner = LocalRunner(number=1, repeat=3, min_repeat_ms=40.0)  # the tuner's runner settings
    rows: list[dict[str, Any]] = []
    print(f"{'#':>3} {'task':64} {'default':>9} {'tuned':>9} {'best':>9} {'ratio':>6}   (ms; best = the faster)")
    try:
        for number, task in enumerate(tasks):
            default = task.default_config()
            tuned = best.get(task.key)
            if tuned is not None and tuned != default and _same_nest(task, default, tuned):
                tuned = default  # another config of the same loop nest (a knob that changes nothing here)
            configs = [default] + ([tuned] if tuned is not None and tuned != default else [])
            other = others.get(task.key)
            if other is not None:
                other = type(default)(other)
                if other != default and _same_nest(task, default, other):
                    other = default
            extra = [other] if other is not None and other != default else []
            if args.changed_only and not extra:
                continue
            artifacts = [r.artifact if r.error_kind is None else None for r in builder.build(task, configs + extra)]
            times = _time(runner, task, artifacts, args.rounds)
            default_s = times[0]
            tuned_s = times[1] if len(configs) > 1 else default_s
            other_s = times[-1] if extra else default_s
            best_s = tuned_s
            for candidate in (default_s, other_s if args.compare_with else None):
                if candidate is not None and best_s is not None and best_s > candidate:
                    best_s = candidate  # the defaults are configs of the space too: the best is never slower
            ratio = default_s / best_s if default_s and best_s else None
            rows.append({"task": number, "description": task.description, "family": task.family,
                         "weight": task.weight, "default_ms": default_s and default_s * 1e3,
                         "tuned_ms": tuned_s and tuned_s * 1e3, "best_ms": best_s and best_s * 1e3,
                         "ratio": ratio, "tuned_is_default": tuned is None or tuned == default})
            if args.compare_with:
                rows[-1].update(other_default_ms=other_s and other_s * 1e3,
                                other_ratio=other_s / best_s if other_s and best_s else None)
            shown = "-" if ratio is None else f"{ratio:.2f}"
            compared = ""
            if args.compare_with:
                other_ratio = rows[-1]["other_ratio"]
                compared = f"   other default {rows[-1]['other_default_ms'] or float('nan'):9.3f} " + (
                    "-" if other_ratio is None else f"{other_ratio:.2f}")
            print(f"{number:3d} {task.description:64.64s} {rows[-1]['default_ms'] or float('nan'):9.3f} "
                  f"{rows[-1]['tuned_ms'] or float('nan'):9.3f} {rows[-1]['best_ms'] or float('nan'):9.3f} "
                  f"{shown:>6}{compared}", flush=True)
    finally:
        runner.close()
    if not rows:
        print("no task to compare")
        return 0
    ratios = [r["ratio"] for r in rows if r["ratio"]]
    weighted_default = sum(r["weight"] * (r["default_ms"] or 0) for r in rows)
    weighted_best = sum(r["weight"] * (r["best_ms"] or 0) for r in rows)
    print(f"tasks {len(rows)}, worst ratio {max(ratios):.2f}, over 2x: "
          f"{sum(r > 2 for r in ratios)}; sum over the model's calls: default {weighted_default:.2f} ms, "
          f"best {weighted_best:.2f} ms")
    if args.compare_with:
        others_ratios = [r["other_ratio"] for r in rows if r["other_ratio"]]
        weighted_other = sum(r["weight"] * (r["other_default_ms"] or 0) for r in rows)
        print(f"other default ({args.compare_with}): worst ratio {max(others_ratios):.2f}, over 2x: "
              f"{sum(r > 2 for r in others_ratios)}; sum over the model's calls {weighted_other:.2f} ms")
    out = Path(args.csv or Path("experiments/results/default_vs_tuned") / f"{Path(args.model).stem}.csv")
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
