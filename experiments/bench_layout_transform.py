"""Layout transform kernels against a plain copy of the same bytes, and the schedule they had before their transpose
mode, in the same run.

    python experiments/bench_layout_transform.py [--rounds 7] [--threads 2] [--csv OUT.csv]

Every workload is one fused function of a planned model (`layout_transform` alone, fused with a ReLU, or after a
concatenation as SqueezeNet's fire modules end) built through the whole path (compute -> template -> LLVM). Three
kernels run per workload, each checked against the reference interpreter first:

- `before`: the injective family's default before the transpose mode: the flat modes (`inner`, `rows` for NCHW{b}c
  outputs), whose vectorized loop runs over a fused `(w, c)` or `(h, w)` axis and divides it per lane;
- `after`: today's default config (the transpose mode: see `search_space.cpu._transpose_loops`);
- `copy`: numpy's `copyto` of an array of the input's bytes, one core (the floor a transform aims at; ours may use
  `--threads` cores).

They are timed in interleaved rounds (each kernel `time_kernel`'s median of 3 repeats of at least `--min-ms`, the
copy the same way); the table gives each one's median over the rounds, and the ratios after/copy and before/after.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
for entry in (REPO_ROOT, REPO_ROOT / "experiments"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

from timing import write_rows  # noqa: E402

from relay_tune.codegen.jit import time_kernel  # noqa: E402
from relay_tune.compile.primitive import build_primitive  # noqa: E402
from relay_tune.target import Target  # noqa: E402
from relay_tune.text import parse_module  # noqa: E402
from relay_tune.tuning.relay_task import RelayTuneTask, tasks_from_module  # noqa: E402
from relay_tune.type_infer import infer_types  # noqa: E402


def transform(shape: tuple[int, ...], src: str, dst: str, wrap: str = "$") -> tuple[str, str]:
    expr = f"layout_transform(%x, src_layout=\"{src}\", dst_layout=\"{dst}\")"
    body = wrap.replace("$", expr)
    name = f"{'x'.join(map(str, shape))} {src}->{dst}" + ("" if wrap == "$" else f" in {wrap.split('(')[0]}")
    return name, f"#[version = \"0.0.5\"]\ndef @main(%x: Tensor[{shape}, float32]) {{\n  {body}\n}}\n"


CONCAT = ("2 x 1x16x13x13x16 concatenate+NCHW16c->NCHW", """#[version = "0.0.5"]
def @main(%a: Tensor[(1, 16, 13, 13, 16), float32], %b: Tensor[(1, 16, 13, 13, 16), float32]) {
  layout_transform(concatenate((%a, %b), axis=1), src_layout="NCHW16c", dst_layout="NCHW")
}""")

WORKLOADS = [
    transform((1, 3, 224, 224), "NCHW", "NCHW3c"),     # every CNN's image into the stem convolution
    transform((1, 64, 56, 56), "NCHW", "NCHW16c"),
    transform((1, 24, 56, 56), "NCHW", "NCHW8c"),
    transform((1, 4, 56, 56, 16), "NCHW16c", "NCHW"),
    transform((1, 20, 14, 14, 16), "NCHW16c", "NCHW"),
    transform((1, 80, 7, 7, 16), "NCHW16c", "NCHW"),
    transform((1, 4, 56, 56, 16), "NCHW16c", "NCHW8c"),
    transform((1, 8, 56, 56, 8), "NCHW8c", "NCHW16c"),
    transform((1, 3, 13, 17, 8), "NCHW8c", "NCHW"),     # odd sizes: C = 24, a 13x17 map
    transform((1, 20, 14, 14, 16), "NCHW16c", "NCHW", "nn.relu($)"),
    transform((1, 64, 56, 56), "NCHW", "NCHW16c", "nn.relu($)"),
    CONCAT,                                                # SqueezeNet's last fire module into NCHW
]


def before_config(task: RelayTuneTask) -> Any:
    """The injective default rule as it was before the transpose mode (for a transform: no split period)."""
    default = task.default_config()
    space = task.space
    modes = list(space.knob("mode").values())
    lanes = task.target_info.vector_lanes("float32")
    choices = list(space.knob("vector").values())
    values: dict[str, Any] = {"mode": "inner" if "inner" in modes else "flat",
                              "vector": lanes if lanes in choices else choices[0], "lanes": "block", "unroll": 1}
    if "rows" in modes:
        values.update(mode="rows", vector=max(c for c in choices if c <= 4 * lanes))
    return default.replace(**{k: v for k, v in values.items() if k in space.names})


def time_copy(source: np.ndarray, target: np.ndarray, min_seconds: float) -> float:
    costs = []
    np.copyto(target, source)
    for _ in range(3):
        number, start = 0, time.perf_counter()
        while time.perf_counter() - start < min_seconds:
            np.copyto(target, source)
            number += 1
        costs.append((time.perf_counter() - start) / number)
    return statistics.median(costs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved measurement rounds")
    parser.add_argument("--threads", type=int, default=2, help="cores our kernels may use")
    parser.add_argument("--min-ms", type=float, default=30.0, help="minimum duration of one timing repeat")
    parser.add_argument("--only", default="", help="run workloads whose name contains this text")
    parser.add_argument("--csv", type=Path, default=None, help="write the table here")
    args = parser.parse_args()

    target = Target.host(num_cores=args.threads)
    print(f"target: llvm -mcpu={target.mcpu}, {args.threads} cores; baseline: numpy copyto of the same bytes, 1 core")
    rng = np.random.default_rng(0)
    rows = []
    for name, source in WORKLOADS:
        if args.only and args.only not in name:
            continue
        (task,) = tasks_from_module(infer_types(parse_module(source)), target)
        inputs = [rng.standard_normal(spec.shape).astype(spec.dtype) for spec in task.input_specs()]
        expected = task.reference(inputs)[0]
        configs = {"before": before_config(task), "after": task.default_config()}
        prepared = {}
        for label, config in configs.items():
            kernel = build_primitive(task.func, target, schedule_steps=task.steps(config))
            np.testing.assert_array_equal(np.asarray(kernel(*inputs)), expected, err_msg=f"{name} {label}")
            outputs = [np.empty(expected.shape, expected.dtype)]
            prepared[label] = (kernel, kernel.packing.kernel_arguments(inputs, outputs))
        flat = np.concatenate([x.ravel() for x in inputs])
        copy_target = np.empty_like(flat)
        results: dict[str, list[float]] = {"before": [], "after": [], "copy": []}
        for _ in range(args.rounds):
            for label, (kernel, kernel_args) in prepared.items():
                results[label].append(statistics.median(time_kernel(kernel.kernel, kernel_args, number=1, repeat=3,
                                                                    min_repeat_ms=args.min_ms)))
            results["copy"].append(time_copy(flat, copy_target, args.min_ms / 1000.0))
        us = {label: statistics.median(costs) * 1e6 for label, costs in results.items()}
        after = dict(configs["after"])
        row = {"workload": name, "floats": flat.size, "copy_us": round(us["copy"], 2),
               "before_us": round(us["before"], 2), "after_us": round(us["after"], 2),
               "after_over_copy": round(us["after"] / us["copy"], 2),
               "before_over_after": round(us["before"] / us["after"], 2),
               "before_config": str(dict(configs["before"])), "after_config": str(after)}
        rows.append(row)
        print(f"  {name:48s} copy {us['copy']:7.1f} us  before {us['before']:7.1f}  after {us['after']:7.1f}  "
              f"after/copy {row['after_over_copy']:5.2f}  speed-up {row['before_over_after']:5.2f}", flush=True)
    print(f"\nmedians of {args.rounds} interleaved rounds, microseconds")
    print(f"{'workload':48s} {'floats':>8} {'copy':>7} {'before':>8} {'after':>8} {'after/copy':>10} {'speed-up':>8}")
    for row in rows:
        print(f"{row['workload']:48s} {row['floats']:>8} {row['copy_us']:7.1f} {row['before_us']:8.1f} "
              f"{row['after_us']:8.1f} {row['after_over_copy']:10.2f} {row['before_over_after']:8.2f}")
    if args.csv and rows:
        write_rows(args.csv, rows)


if __name__ == "__main__":
    main()
