"""A stacked bidirectional ONNX LSTM: relay-tune's import and build time, and its latency against onnxruntime.

    python -m experiments recurrent [--layers 2] [--hidden 256] [--seq 64] [--batch 1] [--input 256] [--threads 1]

The model is `--layers` bidirectional LSTM nodes (random weights in [-0.1, 0.1], biases), each layer's output
reshaped to `(seq, batch, 2 * hidden)` for the next, as exporters write it. relay-tune unrolls each LSTM over the
static sequence (one input projection per direction, then one recurrent dense and the fused gates per step) and
builds it with default schedules; the output is checked against onnxruntime's, then both are timed in interleaved
rounds (`experiments.timing`, same threads, onnxruntime with sequential execution and all graph optimisations).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from experiments import UsageError
from experiments.models import ort_session
from experiments.timing import interleaved


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layers", type=int, default=2, help="stacked bidirectional LSTM layers (default 2)")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size (default 256)")
    parser.add_argument("--seq", type=int, default=64, help="sequence length (default 64)")
    parser.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    parser.add_argument("--input", type=int, default=256, help="input feature size (default 256)")
    parser.add_argument("--threads", type=int, default=1, help="threads of both engines (default 1)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (default 5)")
    parser.add_argument("--repeat", type=int, default=5, help="timed inferences per engine and round (default 5)")


def lstm_stack(layers: int, hidden: int, seq: int, batch: int, input_size: int, seed: int = 0) -> Any:
    """The ONNX model (opset 14) of `layers` stacked bidirectional LSTMs."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    initializers, nodes = [], []
    source, size = "X", input_size
    for layer in range(layers):
        weights = {f"W{layer}": (2, 4 * hidden, size), f"R{layer}": (2, 4 * hidden, hidden),
                   f"B{layer}": (2, 8 * hidden)}
        initializers += [numpy_helper.from_array(rng.uniform(-0.1, 0.1, shape).astype(np.float32), name)
                         for name, shape in weights.items()]
        initializers.append(numpy_helper.from_array(np.array([seq, batch, 2 * hidden], np.int64), f"shape{layer}"))
        nodes += [
            helper.make_node("LSTM", [source, *weights], [f"Y{layer}"], hidden_size=hidden, direction="bidirectional"),
            helper.make_node("Transpose", [f"Y{layer}"], [f"T{layer}"], perm=[0, 2, 1, 3]),  # (seq, batch, 2, H)
            helper.make_node("Reshape", [f"T{layer}", f"shape{layer}"], [f"out{layer}"]),
        ]
        source, size = f"out{layer}", 2 * hidden
    graph = helper.make_graph(
        nodes, "lstm_stack", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [seq, batch, input_size])],
        [helper.make_tensor_value_info(source, TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


def run(args: argparse.Namespace) -> int:
    sizes = (args.layers, args.hidden, args.seq, args.batch, args.input, args.threads, args.rounds, args.repeat)
    if min(sizes) < 1:
        raise UsageError("--layers, --hidden, --seq, --batch, --input, --threads, --rounds and --repeat must be at "
                         "least 1")
    import relay_tune
    from relay_tune.frontend import from_onnx
    from relay_tune.target import Target

    model = lstm_stack(args.layers, args.hidden, args.seq, args.batch, args.input)
    x = np.random.default_rng(1).uniform(-1, 1, (args.seq, args.batch, args.input)).astype(np.float32)
    start = time.perf_counter()
    mod, _ = from_onnx(model)
    imported = time.perf_counter() - start
    start = time.perf_counter()
    compiled = relay_tune.build(mod, target=Target.host(num_cores=args.threads))
    built = time.perf_counter() - start
    print(f"{args.layers} bidirectional LSTM layer(s), hidden {args.hidden}, seq {args.seq}, batch {args.batch}: "
          f"import {imported:.1f} s, build {built:.1f} s, {compiled.num_kernel_calls} kernel calls, "
          f"{len(compiled.plan.tasks)} tasks")
    session = ort_session(model, args.threads)
    want = np.asarray(session.run(None, {"X": x})[0])
    error = float(np.abs(np.asarray(compiled.run(X=x)) - want).max() / max(float(np.abs(want).max()), 1e-30))
    print(f"error relative to onnxruntime's output scale: {error:.2e}")
    timed = interleaved({"onnxruntime": lambda: session.run(None, {"X": x}), "relay-tune": compiled},
                        rounds=args.rounds, repeat=args.repeat, inputs={"X": x})
    for name, samples in timed.items():
        print(f"  {name}: {samples.describe()}")
    print(f"  ratio relay-tune / onnxruntime: {timed['relay-tune'].median / timed['onnxruntime'].median:.2f}")
    return 0 if error < 1e-4 else 1
