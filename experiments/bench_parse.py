"""How fast is the Relay text front end? Parse and print times for the larger corpus programs.

    python experiments/bench_parse.py [--repeat 5]

For each program the sidecar constants are synthesised first (not timed), then the text is parsed
`--repeat` times and the best time is reported, together with printing the parsed module and
parsing the printed text again. Also times a generated 10,000-binding program.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from relay_tune.text import load_constants_sidecar, parse_module, print_module
from relay_tune.text.loader import sidecar_path

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "relay_corpus"
PROGRAMS = ["tvm_menagerie_resnet50.relay", "tvm_menagerie_mobilenet.relay", "tvm_menagerie_gpt2.relay"]


def best_of(repeat: int, fn: Callable[..., object], *args: object, **kwargs: object) -> float:
    """Best wall time of `fn(*args, **kwargs)` over `repeat` calls."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args, **kwargs)
        best = min(best, time.perf_counter() - start)
    return best


def chain_program(n: int) -> str:
    lines = ['#[version = "0.0.5"]', "def @main(%x: Tensor[(4), float32]) {", "  %0 = nn.relu(%x);"]
    lines += [f"  %{i} = add(%{i - 1}, %x);" for i in range(1, n)]
    lines += [f"  %{n - 1}", "}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    args = parser.parse_args()
    print(f"{'program':40s} {'lines':>6s} {'parse ms':>9s} {'print ms':>9s} {'reparse ms':>10s}")
    for name in PROGRAMS:
        path = args.corpus / name
        text = path.read_text()
        constants = load_constants_sidecar(sidecar_path(path))
        mod = parse_module(text, name, constants)
        parse_s = best_of(args.repeat, parse_module, text, name, constants)
        printed_constants: list[np.ndarray] = []
        printed = print_module(mod, constants_out=printed_constants)
        print_s = best_of(args.repeat, print_module, mod, constants_out=[])
        reparse_s = best_of(args.repeat, parse_module, printed, name, printed_constants)
        lines = text.count("\n")
        print(f"{name:40s} {lines:6d} {parse_s * 1e3:9.1f} {print_s * 1e3:9.1f} {reparse_s * 1e3:10.1f}")
    chain = chain_program(10_000)
    chain_mod = parse_module(chain)
    chain_s = best_of(args.repeat, parse_module, chain)
    chain_print_s = best_of(args.repeat, print_module, chain_mod)
    print(f"{'generated 10,000-binding chain':40s} {10_002:6d} {chain_s * 1e3:9.1f} {chain_print_s * 1e3:9.1f}")


if __name__ == "__main__":
    main()
