"""An RNN cell over many steps, as a recursive Relay loop (the virtual machine) and unrolled (a static graph).

Both programs compute h_{t+1} = tanh(dense(h_t, W) + dense(x_t, U) + b) for `--steps` steps
(`relay_tune.testing.control_flow`). The recursive one is a global function `@loop` that calls itself with a
counter: `relay_tune.build` compiles it for the virtual machine (`relay_tune.runtime.vm`), whose plain loops run
as generated code; the unrolled one is one static graph plan. Both are checked against the interpreter, then timed
in interleaved rounds; the ratio recursive / unrolled is the VM's cost of looping (the recursive program also runs
the counter's and the condition's kernels every step).

    python -m experiments relay-vm --steps 64 --hidden 32
"""

from __future__ import annotations

import argparse

import numpy as np

import relay_tune
from experiments import UsageError
from experiments.timing import interleaved
from relay_tune.interpreter import Interpreter
from relay_tune.testing.control_flow import rnn_recursive, rnn_unrolled
from relay_tune.text import parse_module
from relay_tune.type_infer import infer_types


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=64, help="RNN steps (default 64)")
    parser.add_argument("--hidden", type=int, default=32, help="state size (default 32)")
    parser.add_argument("--features", type=int, default=16, help="input size per step (default 16)")
    parser.add_argument("--batch", type=int, default=1, help="batch (default 1)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (default 7)")
    parser.add_argument("--interpreted", action="store_true",
                        help="also time the VM with its native loops off (every instruction in Python)")


def run(args: argparse.Namespace) -> int:
    if min(args.steps, args.hidden, args.features, args.batch, args.rounds) < 1:
        raise UsageError("--steps, --hidden, --features, --batch and --rounds must be positive")
    sizes = dict(steps=args.steps, hidden=args.hidden, batch=args.batch, features=args.features)
    recursive = infer_types(parse_module(rnn_recursive(**sizes)))
    unrolled = infer_types(parse_module(rnn_unrolled(**sizes)))
    vm, graph = relay_tune.build(recursive), relay_tune.build(unrolled)
    rng = np.random.default_rng(0)
    inputs = {name: (rng.uniform(-0.3, 0.3, shape)).astype(dtype) for name, shape, dtype in vm.input_info()}
    expected = Interpreter(recursive).run(dict(inputs))
    for name, model in (("recursive (VM)", vm), ("unrolled (graph)", graph)):
        error = float(np.abs(model.run(**inputs) - expected).max())
        print(f"{name}: {type(model).__name__}, max |error| against the interpreter {error:.2e}")
        if error > 1e-4:
            print("  MISMATCH")
            return 1
    engines = {"recursive": vm, "unrolled": graph}
    if args.interpreted:
        engines["interpreted"] = vm.with_native_loops(False)
    samples = interleaved(engines, rounds=args.rounds, inputs=inputs)
    for name, sample in samples.items():
        print(f"{name:>12}: median {sample.median * 1e6:9.1f} us per run ({sample.median * 1e6 / args.steps:.2f} us "
              "per step)")
    ratio = samples["recursive"].median / samples["unrolled"].median
    print(f"recursive / unrolled latency ratio: {ratio:.2f}x ({args.steps} steps, hidden {args.hidden})")
    return 0
