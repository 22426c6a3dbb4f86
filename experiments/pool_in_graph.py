"""Pooling kernels in the planned model: their parallel split beside their producer's, and their in-graph time
and the whole model's with the pooling's `parallel` knob switched, in one process.

    python experiments/pool_in_graph.py --onnx resnet50.onnx --log LOG [--rounds 20]

For every pooling task of the model (max / average / global pooling): the build's config (from `--log`), the
outermost parallel loop of its kernel and of the kernel that writes its input (loop extent, and the first index
of the second core's share: equal shares of one contiguous range, as the executor's parallel loops hand them out
before any stealing), so whether the two kernels split the map the same way can be read off. Then the model is
built once per variant: the log as is, twice (the second build is the control: same code, another placement);
each pooling task with its `parallel` knob flipped; the 1x1-map layout transforms as kernels, as before they
became aliases. The builds are timed alternating single inferences (`--rounds` rounds; order flipped every
round), plus the executor's in-graph profile of the pooling calls in the same rounds. Medians; ratios against
the log's build of the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import relay_tune  # noqa: E402
from relay_tune.compile import resolve_target, task_list, task_lookup  # noqa: E402
from relay_tune.compile import tasks as task_lowering  # noqa: E402
from relay_tune.compile.tasks import lower_task  # noqa: E402
from relay_tune.ir import Call  # noqa: E402
from relay_tune.kernel import tir  # noqa: E402
from relay_tune.passes.base import dataflow_post_order  # noqa: E402
from relay_tune.passes.fuse_ops import RESHAPE_LIKE_OPS  # noqa: E402
from relay_tune.records.database import best_for_target  # noqa: E402
from relay_tune.tuning.relay_task import config_to_steps, tasks_from_module  # noqa: E402
from search_space.logged import ConfigNotInSpace  # noqa: E402

POOLS = ("max_pool2d", "avg_pool2d", "global_avg_pool2d")


def first_parallel(stmt: Any) -> tir.For | None:
    """The outermost parallel loop of a kernel body (depth first, in order)."""
    stack = [stmt]
    while stack:
        node = stack.pop(0)
        if isinstance(node, tir.For):
            if node.kind is tir.ForKind.PARALLEL:
                return node
            stack.insert(0, node.body)
        elif isinstance(node, tir.Seq):
            stack[:0] = list(node.stmts)
        elif isinstance(node, tir.Allocate):
            stack.insert(0, node.body)
        elif isinstance(node, tir.IfThenElse):
            stack.insert(0, node.then_body)
    return None


def describe_split(task: Any, steps: Any, target: Any, cores: int) -> str:
    prim, _ = lower_task(task.func, target, steps, "probe")
    body = prim.body
    while isinstance(body, tir.Allocate):
        body = body.body
    loops = list(body.stmts) if isinstance(body, tir.Seq) else [body]
    parts = []
    for stmt in loops:
        loop = first_parallel(stmt)
        if loop is None:
            parts.append("serial")
            continue
        extent = int(loop.extent.value) if hasattr(loop.extent, "value") else int(loop.extent)
        share = -(-extent // cores)
        parts.append(f"parallel {loop.var} in {extent} (second core from {share})")
    return "; ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--onnx", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()

    from relay_tune.frontend import from_onnx

    mod, _ = from_onnx(args.onnx)
    target = resolve_target("llvm")
    tasks = tasks_from_module(mod, target)
    by_key = {t.key: t for t in tasks}
    base = task_lookup([args.log])
    assert base is not None
    ranked, _ = best_for_target([args.log], (target.log_name, str(target)), target.mcpu or None, k=64)

    def picked_config(task: Any) -> dict[str, Any] | None:
        for config in ranked.get(task.key, ()):
            try:
                config_to_steps(task.func, config, target)
                return dict(config)
            except ConfigNotInSpace:  # a record of another space: the build passes it over too
                continue
        return None

    logged = relay_tune.build(mod, target=target, logs=[args.log])
    plan = logged.plan
    pools = [t for t in tasks if t.description.split(" ")[0] in POOLS]
    print(f"{Path(args.onnx).stem}: {len(tasks)} tasks, {len(plan.calls)} kernel calls; {target.num_cores} cores")
    producer_of: dict[str, str] = {}
    for step, call in enumerate(plan.calls):
        if call.task < 0 or plan.tasks[call.task].key not in {p.key for p in pools}:
            continue
        mine = {plan.values[a].storage for a in call.args}
        for earlier in reversed(plan.calls[:step]):  # the last kernel before it that touched its buffers
            if earlier.task >= 0 and any(plan.values[a].storage in mine for a in earlier.args):
                producer_of[plan.tasks[call.task].key] = plan.tasks[earlier.task].key
                break
    for pool in pools:
        print(f"\n{pool.description}: config {picked_config(pool)}")
        steps = base(pool, target)
        print(f"  kernel:   {describe_split(pool, steps, target, target.num_cores)}")
        producer = by_key.get(producer_of.get(pool.key, ""))
        if producer is not None:
            print(f"  producer: {producer.description}: config {picked_config(producer)}")
            print(f"            {describe_split(producer, base(producer, target), target, target.num_cores)}")

    variants: dict[str, dict[str, dict[str, Any]]] = {"log": {}}
    for pool in pools:
        config = picked_config(pool)
        if config is None or "parallel" not in config:
            continue
        short = pool.description.split(" ")[0]
        for value in (0, 1):
            if int(config["parallel"]) != value:
                variants[f"{short} parallel {value}"] = {pool.key: {**config, "parallel": value}}

    def lookup_for(overrides: dict[str, dict[str, Any]]) -> Any:
        def lookup(key: str, tgt: Any) -> Any:
            task = by_key.get(key)
            if task is None:
                return None
            if key in overrides:
                return config_to_steps(task.func, overrides[key], tgt)
            return base(task, tgt)
        return lookup

    # The same build again: how far two builds of the same code differ in this run (memory placement, noise).
    models = {"log": logged, "log, built again": relay_tune.build(mod, target=target, logs=[args.log])}
    for name, overrides in variants.items():
        if name != "log":
            models[name] = relay_tune.build(mod, target=target, logs=lookup_for(overrides))
    # Before layout transforms of a 1x1 map became aliases: only pure reshapes were views.
    original = task_lowering.is_memory_view

    def reshapes_only(func: object) -> bool:
        return original(func) and all(
            n.op_name in RESHAPE_LIKE_OPS for n in dataflow_post_order(func.body) if isinstance(n, Call))

    # both modules that decide views: the build's task list and each task's lowering
    with mock.patch.object(task_lowering, "is_memory_view", reshapes_only), \
            mock.patch.object(task_list, "is_memory_view", reshapes_only):
        models["1x1 transforms as kernels"] = relay_tune.build(mod, target=target, logs=[args.log])
    inputs = logged.random_inputs(seed=0)
    want = logged.run(**inputs)
    for name, model in models.items():
        got = model.run(**inputs)
        assert abs(got - want).max() <= 1e-4 * max(1.0, abs(want).max()), name
    runs: dict[str, list[float]] = {n: [] for n in models}
    profiles: dict[str, dict[str, list[float]]] = {n: {p.key: [] for p in pools} for n in models}
    names = list(models)
    for _ in range(2):
        for model in models.values():
            model.run(**inputs)
    for round_number in range(args.rounds):
        order = names if round_number % 2 == 0 else names[::-1]
        for _ in range(3):
            for name in order:
                start = time.perf_counter()
                models[name].run(**inputs)
                runs[name].append(time.perf_counter() - start)
        for name in order:
            model = models[name]
            for call, seconds in zip(model.plan.calls, model.profile_calls(repeat=1, inputs=inputs)):
                if call.task >= 0 and model.plan.tasks[call.task].key in profiles[name]:
                    profiles[name][model.plan.tasks[call.task].key].append(seconds)
    base_ms = statistics.median(runs["log"]) * 1e3
    heads = "  ".join(f"{p.description.split(' ')[0]:>18} us" for p in pools)
    print(f"\n{'build':<28} {'calls':>5} {'model ms':>9} {'/ log':>6}  {heads}")
    for name in names:
        ms = statistics.median(runs[name]) * 1e3
        cells = "  ".join(f"{statistics.median(profiles[name][p.key]) * 1e6:>21.1f}" for p in pools)
        print(f"{name:<28} {len(models[name].plan.calls):>5} {ms:>9.2f} {ms / base_ms:>6.3f}  {cells}")
    print(f"({args.rounds} rounds x 3 alternating single inferences per build; in-graph: one profiled run per build "
          "and round; medians)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
