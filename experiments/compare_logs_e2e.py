"""Two tuning logs of one ONNX model, end to end in the same run: each log's tuned build against onnxruntime.

    python experiments/compare_logs_e2e.py --onnx resnet50.onnx --log before.jsonl --log after.jsonl [--rounds 15]

Each log gives one build as `relay-tune build --log` makes it (the build's in-graph check on); with the default
build and onnxruntime (`intra_op_num_threads=2`, spinning on) they are timed in interleaved blocks, each after the
process went idle, exactly as `experiments/bench_onnx_e2e.py` times its engines (`time_interleaved`), so a slow
spell of the host falls on all of them alike. Prints medians (ms) and ratios to onnxruntime; every build's output
is checked against onnxruntime's first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
for folder in (REPO_ROOT, REPO_ROOT / "experiments"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from bench_onnx_e2e import first_output, matches, ort_session, time_interleaved  # noqa: E402

import relay_tune  # noqa: E402
from relay_tune.compile import resolve_target  # noqa: E402
from relay_tune.frontend import from_onnx  # noqa: E402

RTOL = 1e-3  # largest error relative to the output's scale, as bench_onnx_e2e.py's default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--onnx", required=True)
    parser.add_argument("--log", action="append", required=True, help="a tuning log (give two or more)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per-round", type=int, default=4)
    parser.add_argument("--settle", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = onnx.load(args.onnx)
    mod, _params = from_onnx(args.onnx)
    target = resolve_target("native")
    builds = {"default": relay_tune.build(mod, target=target)}
    for number, log in enumerate(args.log):
        builds[f"log{number + 1}"] = relay_tune.build(mod, target=target, logs=log, check_tuned=True)
    inputs = builds["default"].random_inputs(seed=0)
    session = ort_session(model, args.threads)
    feed = {session.get_inputs()[0].name: next(iter(inputs.values()))}
    want = np.asarray(session.run(None, feed)[0])
    for label, build in builds.items():
        good, error = matches(label, first_output(build.run(**inputs)), want, RTOL)
        if not good:
            raise SystemExit(f"{label} does not match onnxruntime (error {error:.2e} of the output's scale)")
    runners = {"ort": lambda: session.run(None, feed)}
    runners.update({label: (lambda b=build: b.run(**inputs)) for label, build in builds.items()})
    samples, _spins, _pairs = time_interleaved(runners, {}, args)
    ort_ms = statistics.median(samples["ort"]) * 1e3
    print(f"{'engine':10s} {'ms':>8s} {'/ ort':>6s}  log")
    for label in runners:
        ms = statistics.median(samples[label]) * 1e3
        log = args.log[int(label[3:]) - 1] if label.startswith("log") else ""
        dropped = builds[label].build_info.get("tuned_check", {}).get("rejected", []) if label in builds else []
        note = f"{Path(log).name} ({len(dropped)} records dropped by the in-graph check)" if log else ""
        print(f"{label:10s} {ms:8.2f} {ms / ort_ms:6.3f}  {note}")


if __name__ == "__main__":
    main()
