"""Where does a parallel loop start to pay? Serial vs parallel default kernels of growing size, timed side by side.

    python experiments/parallel_threshold.py [--rounds 5] [--target "llvm"]

For element-wise work (bias + relu over an NCHW map) and for a reduction-heavy kernel (dense with one row, as the
last layer of a classifier), each size is built twice from its family template at the default config, once with
`parallel` on and once off, and timed in interleaved rounds with the tuner's runner (medians). Prints the work
(iterations of the largest stage: output elements times reduction size) and serial / parallel time; the default
rule's `PARALLEL_MIN_WORK` (search_space.cpu) should sit where the ratio crosses 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys


def _task(source: str, target: str):
    from relay_tune.tuning.operator_tasks import operator_task

    return operator_task(source, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--target", default="llvm")
    args = parser.parse_args(argv)
    from relay_tune.tuning import InlineBuilder, LocalRunner

    cases = []
    for channels, size in ((4, 32), (16, 32), (16, 64), (64, 56), (256, 56), (256, 112)):
        cases.append((f"bias+relu 1x{channels}x{size}x{size}", channels * size * size, f"""#[version = "0.0.5"]
def @main(%x: Tensor[(1, {channels}, {size}, {size}), float32], %w: Tensor[({channels}, 1, 1), float32]) {{
  nn.relu(add(%x, %w))
}}"""))
    for n, k in ((64, 256), (256, 512), (1000, 512), (1000, 2048)):
        cases.append((f"dense 1x{k} * {n}x{k}", n * k, f"""#[version = "0.0.5"]
def @main(%x: Tensor[(1, {k}), float32], %w: Tensor[({n}, {k}), float32]) {{
  nn.dense(%x, %w)
}}"""))
    builder = InlineBuilder()
    runner = LocalRunner(number=1, repeat=3, min_repeat_ms=40.0)
    print(f"{'kernel':28} {'work':>9} {'serial us':>10} {'parallel us':>12} {'serial/par':>10}")
    try:
        for name, work, source in cases:
            task = _task(source, args.target)
            default = task.default_config()
            configs = [default.replace(parallel=0), default.replace(parallel=max(task.space.knob("parallel").values()))]
            artifacts = [r.artifact for r in builder.build(task, configs)]
            samples: list[list[float]] = [[], []]
            for _ in range(args.rounds):
                for i, artifact in enumerate(artifacts):
                    result = runner.run(task, artifact)
                    if result.costs:
                        samples[i].append(statistics.median(result.costs))
            serial, parallel = (statistics.median(s) * 1e6 for s in samples)
            print(f"{name:28} {work:>9} {serial:>10.1f} {parallel:>12.1f} {serial / parallel:>10.2f}", flush=True)
    finally:
        runner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
