"""Whole-model builds of corpus and zoo models: compile time, latency, memory plan, save/load.

    python experiments/bench_models.py                          # MNIST, MobileNet v2, GPT-2 MLP extract, ResNet-50
    python experiments/bench_models.py --models mnist resnet50 --repeat 30 --cores 1
    python experiments/bench_models.py --models zoo:resnet18 zoo:bert_layer   # zoo models at their real size

For each model: `relay_tune.build` with default schedules (or the best records of --log files) and its time split
(graph passes, lowering, LLVM, loading); the largest difference from the reference interpreter on random inputs;
whole-model latency (median and min over --repeat runs, after a warm-up); peak intermediate bytes planned into the
arena against one buffer per intermediate tensor (and the live-set lower bound); then a save/load round trip: file
size, load time (no recompilation: loading links the saved object code) and whether outputs stay identical.

The corpus lives beside the checkout (../shared/relay_corpus); --corpus points elsewhere; without it the default
is the zoo's MobileNet v2, BERT layer and ResNet-50 (`relay_tune.testing.zoo`). Other processes on the
machine disturb multi-core timings (parallel kernels wait for every core); --cores 1 is steadier.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import relay_tune
from relay_tune.interpreter import evaluate
from relay_tune.ir import IRModule
from relay_tune.runtime.model import load
from relay_tune.target import Target
from relay_tune.testing import zoo
from relay_tune.text import load_module
from relay_tune.type_infer import infer_types

MODELS = {
    "mnist": "tvm_menagerie_mnist",
    "mobilenet": "tvm_menagerie_mobilenet",
    "gpt2_mlp": "tvm_menagerie_gpt2_extract",
    "resnet50": "tvm_menagerie_resnet50",
}
DEFAULT_CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "relay_corpus"


def leaves(value: object) -> list[np.ndarray]:
    if isinstance(value, tuple):
        return [leaf for item in value for leaf in leaves(item)]
    return [np.asarray(value)]


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f}"


def bench(name: str, mod: IRModule, target: Target, repeat: int, logs: list[str], jobs: int | None
          ) -> dict[str, str]:
    start = time.perf_counter()
    model = relay_tune.build(mod, target=target, logs=logs or None, jobs=jobs)
    build_s = time.perf_counter() - start
    t = model.build_info["timings"]

    inputs = model.random_inputs(0)
    expected = leaves(evaluate(mod, inputs))
    got = leaves(model.run(**inputs))
    error = max(float(np.max(np.abs(g - e))) / max(1.0, float(np.max(np.abs(e)))) for g, e in zip(got, expected))
    stats = model.benchmark(repeat=repeat, number=1, inputs=inputs, warmup=2)
    memory = model.memory_report()

    with tempfile.TemporaryDirectory() as folder:
        saved = model.save(Path(folder) / f"{name}.rtmod")
        size = saved.stat().st_size
        start = time.perf_counter()
        loaded = load(saved)
        load_s = time.perf_counter() - start
        identical = all(np.array_equal(a, b) for a, b in zip(leaves(loaded.run(**inputs)), got))

    return {
        "model": name,
        "kernels": f"{model.build_info['kernels']} ({len(model.plan.calls)} calls)",
        "build s": f"{build_s:.2f}",
        "passes/lower/llvm/load": f"{t['passes_s']:.2f}/{t['lower_s']:.2f}/{t['llvm_s']:.2f}/{t['load_s']:.2f}",
        "max rel err": f"{error:.1e}",
        "median ms": f"{stats.median * 1e3:.3f}",
        "min ms": f"{stats.min * 1e3:.3f}",
        "arena MiB": mib(memory.arena_bytes),
        "1 buf/tensor MiB": mib(memory.naive_bytes),
        "lower bound MiB": mib(memory.lower_bound_bytes),
        "file MiB": mib(size),
        "load s": f"{load_s:.3f}",
        "load/build": f"{load_s / build_s:.3f}",
        "same after load": "yes" if identical else "NO",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    zoo_names = [f"zoo:{n}" for n in zoo.MODELS]
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS) + zoo_names, default=None,
                        help="corpus models, or zoo:NAME for a zoo model at its real size")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per model (default 20)")
    parser.add_argument("--cores", type=int, default=None, help="cores kernels may use (default: all available)")
    parser.add_argument("--jobs", type=int, default=None, help="compile processes (default: one per core, max 4)")
    parser.add_argument("--log", action="append", default=[], help="tuning log(s) to build from")
    args = parser.parse_args()

    target = Target.host(args.cores)
    print(f"target: {target.mcpu}, {target.num_cores} core(s); "
          + ("tuned from " + ", ".join(args.log) if args.log else "default schedules"))
    if args.models is None:
        args.models = list(MODELS) if args.corpus.is_dir() else ["zoo:mobilenet_v2", "zoo:bert_layer", "zoo:resnet50"]
    rows = []
    for name in args.models:
        if name.startswith("zoo:"):
            mod = zoo.full(name.removeprefix("zoo:"))
        else:
            path = args.corpus / f"{MODELS[name]}.relay"
            if not path.is_file():
                raise SystemExit(f"{path} not found (use --corpus, or zoo models: {', '.join(zoo_names)})")
            mod = infer_types(load_module(path))
        rows.append(bench(name, mod, target, args.repeat, args.log, args.jobs))
        print(" | ".join(f"{k}: {v}" for k, v in rows[-1].items()), flush=True)

    columns = list(rows[0])
    widths = [max(len(c), *(len(r[c]) for r in rows)) for c in columns]
    print()
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for row in rows:
        print("  ".join(row[c].rjust(w) for c, w in zip(columns, widths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
