"""`python -m experiments <subcommand> [options]`: relay-tune's benchmarks (see experiments/README.md)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from experiments import UsageError

# subcommand -> (module of this package, one line for the list of subcommands)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "kernels": ("kernels", "default kernels (dense, batch_matmul, conv2d, depthwise) against numpy/OpenBLAS"),
    "search": ("search", "search efficiency: trials each strategy (random, Optuna TPE, XGBoost) needs"),
    "curve": ("curve", "tuning curve: a model's end-to-end latency against tuning time"),
    "models": ("models", "whole ONNX models against onnxruntime (and OpenVINO when installed)"),
    "layers": ("layers", "one network layer by layer: relay-tune's kernel times beside OpenVINO's per-layer counters"),
    "build-time": ("build_time", "whole-model build time: first, second (kernel cache), build-cache hit, import"),
    "grouped-conv": ("grouped_conv", "ShuffleNet v1: before and after a change, onnxruntime, OpenVINO"),
    "recurrent": ("recurrent", "a stacked bidirectional LSTM: build time and latency against onnxruntime"),
    "trained": ("trained", "trained ONNX models shipped in pip wheels against onnxruntime (fetched, not committed)"),
    "spin-policy": ("spin_policy", "libgomp's idle spin count against trained models' latency on a busy host"),
    "thread-team": ("thread_team", "the native thread team against libgomp, idle and with busy processes beside"),
    "fidelity": ("fidelity", "each task's logged time against its time inside the model"),
    "distributed": ("distributed", "distributed tuning: workers on one PostgreSQL, trials per second"),
    "fuzz": ("fuzz", "the fuzz campaign through parse, types, passes, the interpreter and LLVM"),
    "int8": ("int8", "a QDQ int8 ResNet-50 against our fp32 build and onnxruntime; int8 conv kernels against the peak"),
    "dequantize-fusion": ("dequantize_fusion", "an int8 ResNet-50 with uint8 projection shortcuts against a baseline "
                          "checkout: in-graph profile call by call"),
    "pooling": ("pooling", "pooling kernels of quantized graphs against a baseline checkout; QuantizedPooling in int8"),
    "relay-vm": ("relay_vm", "an RNN as a recursive loop (the Relay VM) against the same RNN unrolled"),
    "elementwise": ("elementwise", "a network's element-wise kernels alone, before and after, against a STREAM triad"),
    "bf16": ("bf16", "bf16 builds (widened on CPUs without AVX512_BF16): a batch-1 dense and ResNet-50 against fp32"),
    "matvec": ("matvec", "dense layers at batch 1 (matrix-vector) in GB/s against a STREAM triad of the same run"),
    "quickstart": ("quickstart", "the cold Quickstart: the printed ratio against `relay-tune run`"),
    "fresh-processes": ("fresh_processes", "one saved build in many fresh processes: the spread of their medians"),
    "first-calls": ("first_calls", "a trained model's first calls after idle gaps, against a baseline checkout"),
    "gpu-check": ("gpu_check", "the CUDA back end against the interpreter, cuDNN and cuBLAS (NVIDIA GPU)"),
}


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="python -m experiments", description=__doc__,
        epilog="Run `python -m experiments SUBCOMMAND --help` for a subcommand's options.")
    commands = main.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
    for name, (module_name, summary) in SUBCOMMANDS.items():
        module = importlib.import_module(f"experiments.{module_name}")
        sub = commands.add_parser(name, help=summary, description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run, parser=sub)
    return main


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.run(args))
    except UsageError as error:
        args.parser.exit(2, f"{args.parser.prog}: error: {error}\n")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
