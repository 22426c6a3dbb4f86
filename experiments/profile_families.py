"""In-graph kernel time of ONNX zoo networks by operator family, from the executor's per-kernel timestamps.

    python experiments/profile_families.py [--models squeezenet1_1,shufflenet_v2,...] [--threads 2] [--repeat 30]

For each network (`experiments/onnx_zoo.py`) built with default schedules: the summed in-graph time of its
kernels (`CompiledModel.profile`, median over `--repeat` runs), split into convolutions / dense / batch_matmul
and the rest (pooling, concatenations, channel shuffles, reductions, element-wise), and the share of the rest
spent in concatenations and channel shuffles. Run it from two checkouts back to back to compare code versions.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
for entry in (REPO_ROOT, REPO_ROOT / "experiments"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

from onnx_zoo import ZOO  # noqa: E402

HEAVY = ("conv2d", "dense", "batch_matmul")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="squeezenet1_1,shufflenet_v2,mobilenet_v2,densenet121,inception")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(ZOO)}")

    import relay_tune
    from relay_tune.frontend import from_onnx
    from relay_tune.target import Target

    print(f"{'model':<15} {'kernels ms':>10} {'conv/dense ms':>13} {'rest ms':>8} {'concat/shuffle ms':>17}")
    for name in names:
        onnx_model = ZOO[name]()
        mod, _ = from_onnx(onnx_model)
        shape = tuple(d.dim_value for d in onnx_model.graph.input[0].type.tensor_type.shape.dim)
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        model = relay_tune.build(mod, target=Target.host(num_cores=args.threads))
        rows = model.profile(repeat=args.repeat, inputs={"input": x})
        total = sum(r.seconds for r in rows)
        heavy = sum(r.seconds for r in rows if any(op in r.description for op in HEAVY))
        concat = sum(r.seconds for r in rows if "concatenate" in r.description)
        print(f"{name:<15} {total * 1e3:>10.2f} {heavy * 1e3:>13.2f} {(total - heavy) * 1e3:>8.2f} "
              f"{concat * 1e3:>17.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
