"""Layer by layer: where a model's time goes in relay-tune and in onnxruntime, measured in one run.

    python experiments/layers_vs_ort.py --onnx resnet50.onnx [--log logs/resnet50.jsonl] [--rounds 5]
    python experiments/layers_vs_ort.py --zoo resnet50 [--log ...]     # a network of experiments/onnx_zoo.py

The model is built from the log (or with default schedules) and both engines run the same inputs, 2 threads each,
in interleaved rounds: onnxruntime with its node profiler on (spinning off, so that neither engine's idle workers
hold a core during the other's turn), then relay-tune's executor profile (`CompiledModel.profile`: timestamps the
native executor takes between kernel calls). Nodes are matched by what they compute: a convolution by its input
shape, output channels, kernel size and output width (onnxruntime reports logical NCHW shapes whatever layout it
runs in, and fuses bias, residual add and ReLU into its Conv nodes as relay-tune fuses them into one kernel); other
operators are listed by name on their own side.

Per layer: the number of calls on each side, the median time per call, the ratio ours / onnxruntime, and the
time ours loses (+) or wins (-) over all its calls. The end-to-end medians of both engines in the same rounds come
first. A CSV goes to experiments/results/layers_<model>.csv.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
for entry in (REPO_ROOT, REPO_ROOT / "experiments"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

from timing import write_rows  # noqa: E402

import relay_tune  # noqa: E402
from relay_tune.compile import resolve_target  # noqa: E402
from relay_tune.frontend import from_onnx  # noqa: E402

RESULTS = REPO_ROOT / "experiments" / "results"
_OURS_CONV = re.compile(r"^conv2d\w*[+\w]* 1x(\d+)x(\d+)x(\d+) \* (\d+)x\d+x(\d+)x(\d+) s(\d+) p(\d+)")


def conv_layer(cin: int, height: int, width: int, cout: int, kh: int, kw: int, out_width: int) -> str:
    return f"conv {cin}x{height}x{width} -> {cout} {kh}x{kw} out {out_width}"


def our_layer(description: str) -> str:
    """The layer name of one of our tasks (its description: `conv2d_nchw+bias+relu 1x64x56x56 * 64x64x3x3 s1 p1`)."""
    found = _OURS_CONV.match(description)
    if not found:
        return description
    cin, h, w, cout, kh, kw, stride, pad = (int(g) for g in found.groups())
    return conv_layer(cin, h, w, cout, kh, kw, (w + 2 * pad - kw) // stride + 1)


def ort_layer(args: dict[str, Any]) -> str:
    """The layer name of one onnxruntime node from its profile record's arguments."""
    shapes = [tuple(next(iter(x.values()))) for x in args.get("input_type_shape", [])]
    outputs = [tuple(next(iter(x.values()))) for x in args.get("output_type_shape", [])]
    op = args.get("op_name", "?")
    if op in ("Conv", "FusedConv") and len(shapes) >= 2 and len(shapes[0]) == 4 and outputs:
        x, w = shapes[0], shapes[1]
        return conv_layer(x[1], x[2], x[3], w[0], w[2], w[3], outputs[0][3])
    return f"{op} {shapes[0] if shapes else ''}"


def load_model(args: argparse.Namespace) -> tuple[str, str]:
    """(path of the ONNX file, short name)."""
    if args.onnx:
        return args.onnx, Path(args.onnx).stem
    sys.path.insert(0, str(REPO_ROOT / "experiments"))
    import onnx
    from onnx_zoo import RELATIVES, ZOO  # type: ignore[import-not-found]

    builders = {**ZOO, **RELATIVES}
    if args.zoo not in builders:
        raise SystemExit(f"--zoo: unknown network {args.zoo!r}; one of {', '.join(builders)}")
    path = Path(tempfile.mkdtemp()) / f"{args.zoo}.onnx"
    onnx.save(builders[args.zoo](), str(path))
    return str(path), args.zoo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--onnx", help="an ONNX file")
    source.add_argument("--zoo", help="a network of experiments/onnx_zoo.py (e.g. resnet50)")
    parser.add_argument("--log", action="append", help="tuning log(s) to build from (default: default schedules)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import onnxruntime as ort

    path, name = load_model(args)
    mod, _params = from_onnx(path)
    model = relay_tune.build(mod, target=resolve_target("llvm"), logs=args.log, check_tuned=bool(args.log))
    inputs = model.random_inputs(seed=0)

    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feed = {i.name: v for i, v in zip(session.get_inputs(), inputs.values(), strict=True)}
    session.run(None, feed)
    model.run(**inputs)

    ours: dict[str, list[float]] = {}
    calls: dict[str, int] = {}  # per layer, over all rounds
    e2e_ours: list[float] = []
    e2e_ort: list[float] = []
    clock = time.perf_counter
    for _ in range(args.rounds):
        for _ in range(args.per_round):
            start = clock()
            session.run(None, feed)
            e2e_ort.append(clock() - start)
        spent: dict[str, float] = {}
        for row in model.profile(repeat=args.per_round, inputs=inputs):
            # tasks that differ only in their epilogue (with or without a residual add) are one layer here
            layer = our_layer(row.description)
            spent[layer] = spent.get(layer, 0.0) + row.per_call * row.calls
            calls[layer] = calls.get(layer, 0) + row.calls
        for layer, seconds in spent.items():
            ours.setdefault(layer, []).append(seconds)
        for _ in range(args.per_round):
            start = clock()
            model.run(**inputs)
            e2e_ours.append(clock() - start)

    profile_path = session.end_profiling()
    by_node: dict[tuple[str, str], list[float]] = {}
    with open(profile_path) as handle:
        for event in json.load(handle):
            if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
                key = (event["name"], ort_layer(event["args"]))
                by_node.setdefault(key, []).append(event["dur"] * 1e-6)
    os.remove(profile_path)
    theirs: dict[str, list[float]] = {}
    for (_node, layer), durations in by_node.items():
        theirs.setdefault(layer, []).append(statistics.median(durations[1:] or durations))  # first run: warm-up

    rounds = args.rounds
    calls = {layer: n // rounds for layer, n in calls.items()}

    def ours_total(layer: str) -> float:
        return statistics.median(ours[layer]) if layer in ours else 0.0

    rows = []
    for layer in sorted(set(ours) | set(theirs), key=lambda k: -ours_total(k)):
        n_mine = calls.get(layer, 0)
        mine = ours_total(layer) / n_mine if layer in ours else None
        other = statistics.median(theirs[layer]) if layer in theirs else None
        n_other = len(theirs.get(layer, []))
        rows.append({"layer": layer, "calls_ours": n_mine, "calls_ort": n_other,
                     "ours_us": mine * 1e6 if mine else None, "ort_us": other * 1e6 if other else None,
                     "ratio": mine / other if mine and other else None,
                     "loss_ms": (n_mine * (mine or 0.0) - n_other * (other or 0.0)) * 1e3})
    median_ours, median_ort = statistics.median(e2e_ours), statistics.median(e2e_ort)
    print(f"{name}: relay-tune {median_ours * 1e3:.2f} ms, onnxruntime (profiling, no spinning) "
          f"{median_ort * 1e3:.2f} ms, ratio {median_ours / median_ort:.3f}; {len(ours)} of our layers, "
          f"{len(theirs)} of onnxruntime's")
    print(f"{'layer':52s} {'calls':>7s} {'ours us':>9s} {'ort us':>9s} {'ratio':>6s} {'loss ms':>8s}")
    for row in rows:
        ours_us = f"{row['ours_us']:.1f}" if row["ours_us"] else "-"
        ort_us = f"{row['ort_us']:.1f}" if row["ort_us"] else "-"
        ratio = f"{row['ratio']:.2f}" if row["ratio"] else "-"
        print(f"{row['layer'][:52]:52s} {row['calls_ours']:>3d}/{row['calls_ort']:<3d} {ours_us:>9s} {ort_us:>9s} "
              f"{ratio:>6s} {row['loss_ms']:+8.3f}")
    print(f"{'sum of layers':52s} {'':7s} {sum(ours_total(k) for k in ours) * 1e3:8.2f}ms "
          f"{sum(sum(v) for v in theirs.values()) * 1e3:8.2f}ms")
    write_rows(RESULTS / f"layers_{name}.csv", rows)


if __name__ == "__main__":
    main()
