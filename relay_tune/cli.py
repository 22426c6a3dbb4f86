"""The `relay-tune` command line.

    relay-tune model.relay --trials 500      tune a model, write the log, build it from the log
    relay-tune check model.relay             parse + type-check, print the typed program
    relay-tune tasks model.relay             the tuning tasks of the fused model
    relay-tune build model.relay -o m.rtmod  compile (best schedules from --log files) into one file
    relay-tune run m.rtmod                   run a compiled model on random or .npz inputs, time it

User mistakes (bad files, parse and type errors, bad options) end with one clear message and exit code 1
(2 for command-line usage errors); never a Python traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from relay_tune.errors import RelayTuneError, raised_by_interrupt
from relay_tune.version import __version__

# `relay_tune.tuning.tune_model.SEARCH_STRATEGIES`, written out: the parser is built for `relay-tune --help`, which
# must not import the tuner (about 0.5 s with the compiler and Optuna); tests/test_import_contracts.py compares them.
SEARCH_STRATEGIES: tuple[str, ...] = ("xgb", "tpe", "random")
SCHEDULERS: tuple[str, ...] = ("gradient", "round-robin")  # `tune_model.SCHEDULERS`, written out for the same reason

EXIT_USER_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def _command(name: str) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    def register(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        _COMMANDS[name] = fn
        return fn

    return register


def _console() -> Any:
    # start-up: imported on use, so `relay-tune --help` does not load rich's tables (~0.03 s)
    from rich.console import Console

    # Piped or captured output has no terminal width; rich would wrap tables at 80 columns, which
    # splits every workload description over several lines. 140 columns keeps one task per line. Message lines are
    # soft-wrapped (never broken by rich): they hold file paths that a reader or a script copies whole.
    return Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 140)


# -------------------------------------------------------------------------------------------------
# Loading models
# -------------------------------------------------------------------------------------------------


def _require_main(mod: Any, path: str) -> None:
    """Building and tuning start at @main; a module of other functions alone is a user mistake, said in one line."""
    if "main" not in mod:
        names = ", ".join(f"@{name}" for name in mod) or "nothing"
        raise RelayTuneError(f"{path}: the model has no @main function to compile (it defines {names})")


def load_model(path: str, consts: str | None = None, seed: int = 0, params: str | None = None,
               shapes: Sequence[tuple[str, tuple[int, ...]]] = (), static: bool = False) -> Any:
    """Parse a model file (Relay text, or ONNX by extension) and type-check it; `params`: an .npz of values for
    inputs, bound as constants; `shapes`: `--shape` values fixing input shapes; `static`: every input's shape must
    then be known (to compile the model), else one message lists the inputs whose dimensions are not."""
    # start-up: imported on use, so `relay-tune --help` does not load the parser and passes (~0.1 s)
    from relay_tune.frontend.input_shapes import (
        check_shapes,
        onnx_input_dims,
        relay_input_dims,
        require_known_shapes,
        with_input_shapes,
    )

    # start-up: imported on use, so `relay-tune --help` does not load type inference and the operators (~0.1 s)
    from relay_tune.type_infer import infer_types

    p = Path(path)
    if p.is_dir():
        raise RelayTuneError(f"{path}: is a folder, not a model file")
    if not p.is_file():
        raise RelayTuneError(f"{path}: no such file")
    try:
        with open(p, "rb"):
            pass
    except OSError as err:
        raise RelayTuneError(f"{path}: cannot be read ({err.strerror or err})") from None
    given = _shapes_by_name(shapes)
    if p.suffix == ".onnx":
        # start-up: imported on use, so `relay-tune --help` does not load the ONNX importer
        from relay_tune.frontend import from_onnx, load_onnx

        proto = load_onnx(p)
        dims = onnx_input_dims(proto)
        check_shapes(dims, given, path)
        if static:  # before the import, whose conversions may need the sizes themselves
            require_known_shapes({**dims, **given}, path)
        try:
            mod, _params = from_onnx(proto, shape_overrides=given)  # the module embeds the weights
        except RelayTuneError as err:  # a conversion that needs sizes the model leaves open says which to give
            require_known_shapes({**dims, **given}, path, why=str(err))
            raise
    else:
        # start-up: imported on use, so `relay-tune --help` does not load the parser and passes (~0.1 s)
        from relay_tune.text import load_module

        mod = load_module(p, consts=consts, seed=seed)
        if "main" in mod:
            check_shapes(relay_input_dims(mod["main"]), given, path)
            mod = with_input_shapes(mod, given)
    if params:
        # start-up: imported on use, so `relay-tune --help` does not load the compiler (~0.4 s with LLVM)
        from relay_tune.compile import bind_params, read_params

        mod = bind_params(infer_types(mod), read_params(params))
    mod = infer_types(mod)
    if static and "main" in mod:
        require_known_shapes(relay_input_dims(mod["main"]), path)
    return mod


def _shapes_by_name(shapes: Sequence[tuple[str, tuple[int, ...]]]) -> dict[str, tuple[int, ...]]:
    """`--shape` values by input name; naming one input twice with different shapes is a usage error."""
    # start-up: imported on use, so `relay-tune --help` does not load the IR
    from relay_tune.frontend.input_shapes import InputShapeError

    given: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes:
        if given.get(name, shape) != shape:
            raise InputShapeError(f"--shape gives input {name!r} two shapes: {','.join(map(str, given[name]))} "
                                  f"and {','.join(map(str, shape))}")
        given[name] = shape
    return given


# -------------------------------------------------------------------------------------------------
# check
# -------------------------------------------------------------------------------------------------


@_command("check")
def cmd_check(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    mod = load_model(args.model, args.consts, params=args.params, shapes=args.shape)
    elapsed = time.perf_counter() - start
    if args.fused:
        # start-up: imported on use, so `relay-tune --help` does not load the parser and passes (~0.1 s)
        from relay_tune.compile import resolve_target
        from relay_tune.passes import full_range_int8_mode, layout_block, optimize, precision_mode

        host = resolve_target("llvm")
        block = layout_block(host, args.layout_planning)  # as `build` would for this CPU
        mod = optimize(mod, opt_level=args.opt_level, layout_block=block, winograd=args.winograd,
                       full_range_int8=full_range_int8_mode(host), precision=precision_mode(args.precision, host))
    if args.summary:
        _print_summary(mod, args.model, elapsed)
        return 0
    # start-up: imported on use, so `relay-tune --help` does not load the parser and passes (~0.1 s)
    from relay_tune.text import print_module

    sys.stdout.write(print_module(mod, show_types=not args.no_types))
    if not sys.stdout.isatty():
        sys.stdout.write("\n")
    return 0


def _print_summary(mod: Any, path: str, elapsed: float) -> None:
    # start-up: imported on use, so `relay-tune --help` does not load rich's tables (~0.03 s)
    from rich.table import Table

    # start-up: imported on use, so `relay-tune --help` does not load the parser and passes (~0.1 s)
    from relay_tune.analysis import summarize

    summary = summarize(mod)
    console = _console()
    main = mod["main"]
    console.print(f"[bold]{path}[/bold]: parsed and type-checked in {elapsed * 1e3:.0f} ms")
    for p in main.params:
        console.print(f"  input  %{p.name_hint}: {p.checked_type}")
    console.print(f"  output {main.body.checked_type}")
    table = Table(title="operators", show_edge=False)
    table.add_column("operator")
    table.add_column("count", justify="right")
    for name, count in summary.op_counts.items():
        table.add_row(name, str(count))
    console.print(table)
    console.print(
        f"  parameters: {summary.num_parameters:,} ({summary.parameter_bytes / 2**20:.1f} MiB)\n"
        f"  FLOPs: {summary.flops / 1e9:.3f} G per inference"
    )


# -------------------------------------------------------------------------------------------------
# tasks
# -------------------------------------------------------------------------------------------------


@_command("tasks")
def cmd_tasks(args: argparse.Namespace) -> int:
    # start-up: imported on use, so `relay-tune --help` does not load rich's tables (~0.03 s)
    from rich.table import Table

    # start-up: imported on use, so `relay-tune --help` does not load the parser and passes (~0.1 s)
    from relay_tune.compile import model_tasks, resolve_target
    from relay_tune.passes import full_range_int8_mode, layout_block, optimize, precision_mode

    loaded = load_model(args.model, args.consts, params=args.params, shapes=args.shape, static=True)
    if args.spaces:  # each task's template family and the size of its schedule space on --target
        # start-up: imported on use, not by `relay-tune --help`: the compiler (~0.4 s with LLVM), the tuner (~0.1 s)
        from relay_tune.tuning.relay_task import tasks_from_module
        from search_space.cpu import format_space_table

        target = resolve_target(args.target)
        specs = tasks_from_module(loaded, target, opt_level=args.opt_level, layout_planning=args.layout_planning,
                                  winograd=args.winograd, precision=args.precision)
        print(f"{args.model}: {len(specs)} tasks on {target.log_name}")
        print(format_space_table([(t.description, t.family, t.space) for t in specs]))
        return 0
    target = resolve_target(args.target)
    block = layout_block(target, args.layout_planning)  # the workloads tuning and builds see
    # the tasks whose kernels the build calls: no aliases, no concatenations written in place
    fused = optimize(loaded, opt_level=args.opt_level, layout_block=block, winograd=args.winograd,
                     full_range_int8=full_range_int8_mode(target), precision=precision_mode(args.precision, target))
    tasks = model_tasks(fused, target).kernels  # the whole module: kernels in branches and other functions too
    total = sum(t.flops * t.occurrences for t in tasks) or 1
    table = Table(title=f"tuning tasks of {args.model}", show_edge=False)
    for col, justify in (("#", "right"), ("key", "left"), ("workload", "left"), ("count", "right"),
                         ("MFLOPs", "right"), ("share", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for i, t in enumerate(tasks):
        share = t.flops * t.occurrences / total
        table.add_row(str(i), t.key[:12], t.description, str(t.occurrences), f"{t.flops / 1e6:.1f}", f"{share:.1%}")
    _console().print(table)
    return 0


# -------------------------------------------------------------------------------------------------
# import
# -------------------------------------------------------------------------------------------------


def _shape_override(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.split(",") if d.strip())
    except ValueError:
        shape = ()
    if not sep or not name or not shape or min(shape) < 0:
        raise argparse.ArgumentTypeError(f"expected NAME=D0,D1,... (non-negative integers), got {text!r}")
    return name, shape


@_command("import")
def cmd_import(args: argparse.Namespace) -> int:
    # start-up: imported on use, so `relay-tune --help` does not load the ONNX importer, the parser and passes (~0.1 s)
    from relay_tune.frontend import from_onnx, load_onnx, params_path, save_params
    from relay_tune.frontend.input_shapes import check_shapes, onnx_input_dims
    from relay_tune.text import print_module

    proto = load_onnx(args.model)
    given = _shapes_by_name(args.shape)
    check_shapes(onnx_input_dims(proto), given, args.model)
    mod, _params = from_onnx(proto, shape_overrides=given)
    constants: list[Any] = []
    text = print_module(mod, show_types=not args.no_types, constants_out=constants)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    params_file = save_params(params_path(out), constants)
    print(f"wrote {out} ({len(mod['main'].params)} input(s), {len(constants)} constant(s)) and {params_file}")
    return 0


# -------------------------------------------------------------------------------------------------
# build / run (compiled models)
# -------------------------------------------------------------------------------------------------


@_command("build")
def cmd_build(args: argparse.Namespace) -> int:

    # start-up: imported on use, so `relay-tune --help` does not load rich's tables (~0.03 s)
    from rich.markup import escape
    from rich.table import Table

    # start-up: imported on use, so `relay-tune --help` does not load the compiler (~0.4 s with LLVM)
    from relay_tune.compile import BuildWarning, build, resolve_target

    # start-up: imported on use, so `relay-tune --help` does not load the passes (~0.1 s)
    from relay_tune.passes import precision_mode
    from relay_tune.resources import check_model_memory, check_writable_file
    from relay_tune.runtime.vm import VMModel

    console = _console()
    # before anything else: a bad target is a usage error, bf16 on a CPU without it a clear error
    precision_mode(args.precision, resolve_target(args.target))
    check_writable_file(args.output, "model file", append=False)
    mod = load_model(args.model, args.consts, params=args.params, shapes=args.shape, static=True)
    _require_main(mod, args.model)
    check_model_memory(mod)
    # start-up: imported on use, so `relay-tune --help` does not load the tuner (~0.1 s)
    from relay_tune.records.log_format import LogWarning

    logs = list(args.log)
    with contextlib.ExitStack() as stack:
        cache = _tuning_cache(args)
        if cache is not None:  # the cache's records for this target and CPU, as one more log
            target = resolve_target(args.target)
            usable = cache.usable((target.log_name, str(target)), target.mcpu or None)
            if usable:
                folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="relay-tune-cache-"))
                logs.append(str(Path(folder) / "cache.jsonl"))
                cache.export(logs[-1], usable)
        if args.storage:  # the global best of a study on a database: its records, exported for this build
            # start-up: imported on use, so `relay-tune --help` does not load the tuner (~0.1 s)
            from relay_tune.tuning.distributed import export_records

            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="relay-tune-build-"))
            exported = Path(folder) / "storage.jsonl"
            export_records(args.storage, exported)
            logs.append(str(exported))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", BuildWarning)
            warnings.simplefilter("always", LogWarning)  # unreadable lines of --log files: one warning per log
            model = build(mod, target=args.target, logs=logs or None, opt_level=args.opt_level, jobs=args.jobs,
                          require_tuned=args.require_tuned, check_tuned=not args.no_check_tuned,
                          layout_planning=args.layout_planning, winograd=args.winograd, precision=args.precision)
    path = model.save(args.output)
    table = Table(title=f"kernels of {args.model}", show_edge=False)
    for col, justify in (("#", "right"), ("key", "left"), ("workload", "left"), ("count", "right"),
                         ("MFLOPs", "right"), ("schedule", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for i, task in enumerate(model.program.tasks if isinstance(model, VMModel) else model.plan.tasks):
        schedule = "alias (no kernel)" if not task.kernel else ("tuned" if task.tuned else "default")
        table.add_row(str(i), task.key[:12], task.description, str(task.occurrences), f"{task.flops / 1e6:.1f}",
                      schedule)
    console.print(table)
    for warning in caught:
        if issubclass(warning.category, BuildWarning | LogWarning):
            console.print(f"[yellow]warning:[/yellow] {escape(str(warning.message))}", highlight=False, soft_wrap=True)
    if model.target.kind == "cuda":
        _print_ptx_build(console, model, path, args)
        return 0
    t = model.build_info["timings"]
    info = model.build_info
    console.print(
        f"compiled {info['kernels']} kernels ({info['tuned_tasks']} tuned, {info['default_tasks']} default) in "
        f"{t['total_s']:.2f} s: passes {t['passes_s']:.2f} s, lowering {t['lower_s']:.2f} s, "
        f"LLVM {t['llvm_s']:.2f} s, load {t['load_s']:.2f} s"
    )
    check = model.build_info.get("tuned_check")
    if check and (check["rejected"] or check["kept_default"]):
        console.print(f"in-graph check: {len(check['rejected'])} tuned record(s) slower in the model than the "
                      "default schedule were not used"
                      + ("; the default build was faster end to end and is the one saved" if check["kept_default"]
                         else ""))
    if isinstance(model, VMModel):  # a program with control flow: kernels under the virtual machine
        console.print(f"control flow: {len(model.program.functions)} functions run by the virtual machine")
    else:
        console.print(f"memory: {model.memory_report()}")
    console.print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB) for target {model.target.mcpu or 'llvm'} "
                  f"({model.target.num_cores} cores)")
    if args.precision != "fp32":
        # start-up: imported on use, so `relay-tune --help` does not load the compiler (~0.4 s with LLVM)
        from relay_tune.compile.precision import relative_error_vs_fp32

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BuildWarning)
            error = relative_error_vs_fp32(model, mod, args.target, opt_level=args.opt_level,
                                           layout_planning=args.layout_planning, winograd=args.winograd)
        label = " (emulated: pairs widened to fp32)" if args.precision == "bf16-emulated" else ""
        console.print(f"precision {args.precision}{label}: relative error against the fp32 build {error:.2e} "
                      "(worst output, L2 norm, seeded random inputs)")
    return 0


@_command("run")
def cmd_run(args: argparse.Namespace) -> int:

    # start-up: imported on use, so `relay-tune --help` does not load the runtime (~0.1 s with LLVM)
    from relay_tune.runtime.model import CompiledModel
    from relay_tune.runtime.vm import load_model as load

    console = _console()
    # start-up: imported on use, so `relay-tune --help` does not load the runtime (~0.1 s with LLVM)
    from relay_tune.runtime.cuda.model import is_gpu_model_file

    if is_gpu_model_file(args.model):  # PTX built for a CUDA target (perhaps on a machine without a GPU)
        if args.others:
            raise RelayTuneError(f"{args.model} is a GPU model: `relay-tune run` compares CPU models only")
        return _run_gpu_model(args, console)
    if args.others and (args.profile or args.output or args.repeat is not None or args.number != 1):
        raise RelayTuneError("with several models, `relay-tune run` times them in interleaved rounds: --profile, "
                             "--output, --repeat and --number take one model")
    start = time.perf_counter()
    model = load(args.model)
    load_s = time.perf_counter() - start
    if args.profile and not isinstance(model, CompiledModel):
        raise RelayTuneError(f"{args.model} is a program with control flow (virtual machine): --profile times the "
                             "kernels of static graphs only; time it whole with --repeat")
    if args.inputs:
        try:
            with np.load(args.inputs, allow_pickle=False) as archive:
                inputs = {name: archive[name] for name in archive.files}
        except ValueError as err:
            raise RelayTuneError(f"{args.inputs}: not a readable .npz file ({err})") from None
    else:
        inputs = model.random_inputs(args.seed)
    outputs = model.run(**inputs)
    flat: list[Any] = []
    stack: list[Any] = [outputs]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):
            stack.extend(reversed(item))
        else:
            flat.append(item)
    console.print(f"loaded {args.model} in {load_s * 1e3:.0f} ms; inputs: "
                  + ", ".join(f"{n} {list(s)} {d}" for n, s, d in model.input_info())
                  + ("" if args.inputs else f" (random, seed {args.seed})"))
    for i, out in enumerate(flat):
        console.print(f"  output {i}: {list(out.shape)} {out.dtype}")
    if args.output:
        np.savez(args.output, **{f"output_{i}": out for i, out in enumerate(flat)})
        console.print(f"wrote {args.output}")
    if args.others:
        return _run_compared(args, model, inputs, flat, console)
    if args.repeat is None or args.repeat > 0:
        # start-up: imported on use, so `relay-tune --help` does not load the runtime (~0.1 s with LLVM)
        from relay_tune.runtime.benchmark import WARMUP_S, steady_latency, warm_up

        # Warmed first, then rounds of single runs over about a second, as the tuner's before/after timing measures
        # each build: ten cold runs of a 50 us model spread by 30% from one process to the next.
        if args.repeat is None and args.number == 1:
            costs = steady_latency(model, inputs)
        else:
            warm_up(model, inputs, WARMUP_S)
            costs = model.benchmark(repeat=args.repeat or 10, number=args.number, inputs=inputs, warmup=0).costs
        console.print(f"latency: median {statistics.median(costs) * 1e3:.3f} ms, min {min(costs) * 1e3:.3f} ms "
                      f"({len(costs)} x {args.number} runs, warmed up)")
    if args.profile and args.log:
        # start-up: imported on use, so `relay-tune --help` does not load the runtime (~0.1 s with LLVM)
        from relay_tune.runtime.profile import compare_with_logs

        assert isinstance(model, CompiledModel)  # a VM model with --profile was refused above
        console.print("  in model  per call   logged  ratio  (per call: in the model; logged: best record)")
        for entry in compare_with_logs(model, args.log, _profile_repeat(args.repeat), inputs)[:args.profile]:
            row = entry.profile
            logged = f"{_duration(entry.logged):>9} {entry.ratio:5.2f}x" if entry.ratio else f"{'-':>9} {'':>6}"
            console.print(f"  {_duration(row.seconds):>9} {_duration(row.per_call):>9} {logged}  x{row.calls:<3} "
                          f"{'tuned  ' if row.tuned else 'default'} {row.description}")
    elif args.profile:
        for row in model.profile(repeat=_profile_repeat(args.repeat), inputs=inputs)[:args.profile]:
            console.print(f"  {row.seconds * 1e3:9.3f} ms {row.share:6.1%}  x{row.calls:<3} "
                          f"{'tuned  ' if row.tuned else 'default'} {row.description}")
    return 0


def _run_compared(args: argparse.Namespace, first: Any, inputs: dict[str, Any], first_outputs: list[Any],
                  console: Any) -> int:
    """`relay-tune run A B ...`: each other model checked against A's outputs on the same inputs, then all timed in
    the same interleaved rounds, each one's median and its ratio to A."""

    # start-up: imported on use, so `relay-tune --help` does not load the runtime (~0.1 s with LLVM)
    from relay_tune.runtime.benchmark import EXTEND_S, compare_many
    from relay_tune.runtime.vm import load_model as load

    models = [first]
    for path in args.others:
        other = load(path)
        if other.input_info() != first.input_info():
            raise RelayTuneError(f"{path} takes other inputs than {args.model}: "
                                 + ", ".join(f"{n} {list(s)} {d}" for n, s, d in other.input_info()))
        outputs = other.run(**inputs)
        flat = list(outputs) if isinstance(outputs, tuple) else [outputs]
        worst = max((_relative_error(a, b) for a, b in zip(flat, first_outputs)), default=0.0)
        console.print(f"{path}: outputs within {worst:.1e} of {args.model}'s (largest relative error)")
        models.append(other)
    paths = [args.model, *args.others]
    comparisons = compare_many(models, inputs, extend_s=EXTEND_S)
    first_costs = [c for r in comparisons[0].baseline for c in r]
    console.print("latency in the same interleaved rounds (warmed up, about a second of single runs each):")
    console.print(f"  {args.model}: median {statistics.median(first_costs) * 1e3:.3f} ms, "
                  f"min {min(first_costs) * 1e3:.3f} ms")
    for path, comparison in zip(paths[1:], comparisons):
        costs = [c for r in comparison.candidate for c in r]
        console.print(f"  {path}: median {statistics.median(costs) * 1e3:.3f} ms, min {min(costs) * 1e3:.3f} ms; "
                      f"against {args.model}: {comparison.describe()}", soft_wrap=True)
    return 0


def _relative_error(a: Any, b: Any) -> float:
    """Largest absolute difference over the largest magnitude of `b` (1 for an all-zero `b`)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    return float(np.max(np.abs(a - b))) / (scale or 1.0) if a.size else 0.0


def _profile_repeat(repeat: int | None) -> int:
    """Runs a `--profile` takes its per-kernel medians over: `--repeat`, between 1 and 20 (10 by default)."""
    return 10 if repeat is None else max(1, min(repeat, 20))


def _run_gpu_model(args: argparse.Namespace, console: Any) -> int:
    """`relay-tune run` of a CUDA model file: on this machine's GPU, or one message saying that a GPU is needed."""

    # start-up: imported on use, so `relay-tune --help` does not load the runtime (~0.1 s with LLVM)
    from relay_tune.runtime.cuda.model import load_gpu_model

    model = load_gpu_model(args.model)  # CudaUnavailableError (a RelayTuneError) without a GPU
    rng = np.random.default_rng(args.seed)
    inputs = {i.name: rng.standard_normal(model.plan.values[i.value].shape).astype(model.plan.values[i.value].dtype)
              for i in model.plan.inputs}
    if args.inputs:
        with np.load(args.inputs, allow_pickle=False) as archive:
            inputs = {name: archive[name] for name in archive.files}
    outputs = model.run(**inputs)
    flat = list(outputs) if isinstance(outputs, tuple) else [outputs]
    console.print(f"loaded {args.model} on {model.device.name} ({model.device.arch})")
    for i, out in enumerate(flat):
        console.print(f"  output {i}: {list(np.shape(out))} {np.asarray(out).dtype}")
    if args.repeat is None or args.repeat > 0:
        costs = model.benchmark(repeat=args.repeat or 10, number=args.number, inputs=inputs)
        console.print(f"latency: median {sorted(costs)[len(costs) // 2] * 1e3:.3f} ms ({len(costs)} x {args.number})")
    return 0


def _print_ptx_build(console: Any, model: Any, path: Path, args: argparse.Namespace) -> None:
    info = model.build_info
    console.print(f"compiled {info['kernels']} GPU kernels of {info['functions']} functions to PTX for "
                  f"{info['arch']} in {info['timings'].get('total_s', 0.0):.2f} s; ptxas: {info.get('ptxas', '-')}",
                  soft_wrap=True)
    console.print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB) for target {model.target}; run it on a "
                  "machine with an NVIDIA GPU (relay-tune run)", soft_wrap=True)


# -------------------------------------------------------------------------------------------------
# tune (the main form: relay-tune MODEL --trials N)
# -------------------------------------------------------------------------------------------------


def _duration(seconds: float | None) -> str:
    """Kernel and model times in readable units: "8.2 us", "1.234 ms", "2.50 s"."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds:.2f} s"


_SHORT_REASONS = {"no unmeasured config left in the search space": "space exhausted"}


def _resume_command(args: argparse.Namespace, log: Path) -> str:

    words = ["relay-tune", args.model, "--trials", str(args.trials), "--log", str(log)]
    if args.target != "llvm":
        words += ["--target", args.target]
    if args.tasks:
        words += ["--tasks", args.tasks]
    if args.search != "xgb":
        words += ["--search", args.search]
    if getattr(args, "scheduler", "gradient") != "gradient":
        words += ["--scheduler", args.scheduler]
    if args.storage:
        words += ["--storage", args.storage]
    if args.seed:
        words += ["--seed", str(args.seed)]
    if args.params:
        words += ["--params", args.params]
    if getattr(args, "layout_planning", None) is not None:  # the resumed run must tune the same workloads
        words += ["--layout-planning" if args.layout_planning else "--no-layout-planning"]
    if getattr(args, "winograd", None) is not None:  # likewise
        words += ["--winograd", args.winograd]
    if getattr(args, "precision", "fp32") != "fp32":  # likewise
        words += ["--precision", args.precision]
    if getattr(args, "no_check", False):
        words += ["--no-check"]
    return " ".join(shlex.quote(w) for w in words)


@_command("tune")
def cmd_tune(args: argparse.Namespace) -> int:
    # start-up: imported on use, so `relay-tune --help` does not load the tuner (~0.1 s)
    from relay_tune.tuning.tune_model import (
        BuildOptions,
        MeasureOptions,
        RichProgress,
        SearchOptions,
        default_log_path,
        tune_model,
    )

    console = _console()
    if args.trials < 0:
        raise RelayTuneError(f"--trials must be >= 0, got {args.trials}")
    # start-up: imported on use, so `relay-tune --help` does not load the compiler (~0.4 s with LLVM)
    from relay_tune.compile import resolve_target

    # start-up: imported on use, so `relay-tune --help` does not load the passes (~0.1 s)
    from relay_tune.passes import precision_mode

    # a bad target fails here, before the model is loaded or a GPU looked for; bf16 on a CPU without it too
    precision_mode(args.precision, resolve_target(args.target))
    log = Path(args.log) if args.log else default_log_path(args.model, args.target)
    output = Path(args.output) if args.output else log.with_suffix(".rtmod")
    # start-up: imported on use, so `relay-tune --help` does not load the compiler (~0.4 s with LLVM)
    from relay_tune.resources import check_model_memory, check_writable_file

    check_writable_file(log, "tuning log")  # before any measurement that could not be recorded
    check_writable_file(output, "model file", append=False)
    mod = load_model(args.model, args.consts, params=args.params, shapes=args.shape, static=True)
    _require_main(mod, args.model)
    check_model_memory(mod)
    if args.no_check:
        console.print(f"--no-check: kernel outputs are not compared with the reference interpreter (noted in {log})",
                      soft_wrap=True)
    progress = RichProgress(console)
    try:
        with _interrupt_first():
            result = tune_model(mod, args.target, args.trials, log, progress=progress, search=SearchOptions(
                strategy=args.search, storage=args.storage or "default", transfer_from=args.transfer_from,
                seed=args.seed, scheduler=args.scheduler, timeout=args.timeout, task_filter=args.tasks,
                cache=_tuning_cache(args), retune=args.retune),
                measure=MeasureOptions(jobs=args.jobs, check=not args.no_check),
                build=BuildOptions(opt_level=args.opt_level, layout_planning=args.layout_planning,
                                   winograd=args.winograd, precision=args.precision, output=output))
    except KeyboardInterrupt:
        progress.close()
        console.print(f"interrupted; every measurement so far is in {log}. Resume with:\n  "
                      f"{_resume_command(args, log)}", soft_wrap=True)  # a command must stay copyable
        return EXIT_INTERRUPTED
    finally:
        progress.close()
    _print_tune_result(console, result)
    if result.interrupted:
        console.print(f"interrupted after {result.summary.trials_done} of {result.summary.total_trials} trials; "
                      f"every measurement is in {result.log_path}. Resume with:\n  {_resume_command(args, log)}",
                      soft_wrap=True)
        return EXIT_INTERRUPTED
    return 0


def _print_tune_result(console: Any, result: Any) -> None:
    # start-up: imported on use, so `relay-tune --help` does not load rich's tables (~0.03 s)
    from rich.table import Table

    summary = result.summary
    table = Table(title=f"tuning results ({result.target})", show_edge=False)
    for col, justify in (("#", "right"), ("workload", "left"), ("count", "right"), ("trials", "right"),
                         ("default", "right"), ("tuned", "right"), ("speedup", "right"), ("GFLOPS", "right"),
                         ("note", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for i, task in enumerate(result.tasks):
        note = _SHORT_REASONS.get(task.stopped or "", task.stopped or "")
        if task.best_cost is None and task.trials:
            note = "no valid kernel: default schedule used" + (f" ({', '.join(task.errors)})" if task.errors else "")
        speedup = f"{task.speedup:.2f}x" if task.speedup is not None else "-"
        gflops = f"{task.best_gflops:.1f}" if task.best_gflops is not None else "-"
        table.add_row(str(i), task.description, str(task.weight), f"{task.valid_trials}/{task.trials}",
                      _duration(task.default_cost), _duration(task.best_cost), speedup, gflops, note)
    console.print(table)
    seconds = summary.seconds.get("total", 0.0)
    done = summary.trials_this_session
    rate = f", {done / seconds * 60:.0f} trials/min" if done and seconds > 0 else ""
    console.print(f"{done} trials this run ({summary.trials_done} of {summary.total_trials} in the log) in "
                  f"{seconds:.1f} s{rate}" + (" (stopped by --timeout)" if result.timed_out else ""))
    if result.latency is not None:  # medians of interleaved, warmed rounds; a ratio only where the rounds agree
        timed = result.latency
        if result.latency_after == timed.candidate_s:
            console.print(f"end-to-end latency: {_duration(timed.baseline_s)} with default schedules, "
                          f"{_duration(timed.candidate_s)} tuned ({timed.describe()})", soft_wrap=True)
        else:
            console.print(f"end-to-end latency: {_duration(timed.baseline_s)} with default schedules, "
                          f"{_duration(timed.candidate_s)} with the records ({timed.describe()}): the model is "
                          "built with default schedules", soft_wrap=True)
    console.print(f"log: {result.log_path}")
    if result.cache_path is not None:
        skipped = (f"{result.cached_tasks} task(s) tuned before on this CPU were not tuned again (--retune tunes "
                   "them); " if result.cached_tasks else "")
        console.print(f"tuning cache: {skipped}{result.cache_added} record(s) added to {result.cache_path}",
                      soft_wrap=True)
    if result.model_path is not None:
        console.print(f"model: {result.model_path} (run it with `relay-tune run {result.model_path}`)")


# -------------------------------------------------------------------------------------------------
# logs (summary / best / merge)
# -------------------------------------------------------------------------------------------------


@_command("logs")
def cmd_logs(args: argparse.Namespace) -> int:

    # start-up: imported on use, so `relay-tune --help` does not load the tuner (~0.1 s)
    from relay_tune.records.log_format import LogWarning

    console = _console()
    if args.action not in _LOG_ACTIONS:  # `relay-tune logs LOG...` means `logs summary LOG...`
        args.logs.insert(0, args.action)
        args.action = "summary"
    if not args.logs and not args.storage:
        raise RelayTuneError(f"logs {args.action} needs tuning logs (LOG.jsonl ...) or --storage URL")
    for path in args.logs:
        if not Path(path).is_file():
            raise RelayTuneError(f"{path}: no such file")
    if args.storage:
        # start-up: imported on use, so `relay-tune --help` does not load the tuner (~0.1 s)
        from relay_tune.tuning.study_logs import STORAGE_ACTIONS, storage_summary

        if args.action == "summary":
            return storage_summary(args, console, _logs_summary)
        if args.action not in STORAGE_ACTIONS:
            raise RelayTuneError(f"logs {args.action} works on log files; export the database first: "
                                 "relay-tune logs export --storage URL -o all.jsonl")
        return STORAGE_ACTIONS[args.action](args, console)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LogWarning)
        code = _LOG_ACTIONS[args.action](args, console)
    shown = set()
    for warning in caught:  # one per log, counting its unreadable lines by reason (a log read twice says it once)
        if issubclass(warning.category, LogWarning) and str(warning.message) not in shown:
            shown.add(str(warning.message))
            # start-up: imported on use, so `relay-tune --help` does not load rich's tables (~0.03 s)
            from rich.markup import escape

            console.print(f"[yellow]warning:[/yellow] {escape(str(warning.message))}", highlight=False, soft_wrap=True)
    return code


def _log_groups(paths: Sequence[str]) -> dict[tuple[str, str], list[Any]]:
    # start-up: imported on use, so `relay-tune --help` does not load the tuner (~0.1 s)
    from relay_tune.records.log_format import read_records

    groups: dict[tuple[str, str], list[Any]] = {}
    for record in read_records(list(paths)):
        groups.setdefault((record.workload_key, record.target), []).append(record)
    return groups


def _logs_summary(args: argparse.Namespace, console: Any) -> int:

    # start-up: imported on use, so `relay-tune --help` does not load rich's tables (~0.03 s)
    from rich.table import Table

    # start-up: imported on use, so `relay-tune --help` does not load the tuner (~0.1 s)
    from relay_tune.records.database import top_k
    from relay_tune.records.log_format import read_events

    groups = _log_groups(args.logs)
    label = getattr(args, "label", None) or ", ".join(args.logs)
    table = Table(title=f"{sum(len(r) for r in groups.values())} records in {label}", show_edge=False)
    for col, justify in (("key", "left"), ("workload", "left"), ("target", "left"), ("records", "right"),
                         ("valid", "right"), ("errors", "left"), ("default", "right"), ("best", "right"),
                         ("GFLOPS", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for (key, target), records in groups.items():
        valid = [r for r in records if r.ok]
        best = top_k(records, 1)
        defaults = [r.cost for r in valid if r.strategy == "default" and r.cost is not None]
        errors = Counter(r.error_kind.name for r in records if r.error_kind is not None)
        gflops = best[0].gflops if best else None
        table.add_row(key[:12], records[-1].description, _short_target(target), str(len(records)), str(len(valid)),
                      ", ".join(f"{n} {k}" for k, n in errors.most_common()),
                      _duration(min(defaults) if defaults else None), _duration(best[0].cost if best else None),
                      f"{gflops:.1f}" if gflops is not None else "-")
    console.print(table)
    events = read_events(list(args.logs))
    started = {e.session for e in events if e.event == "session_start"}
    ended = {e.session: e for e in events if e.event == "session_end"}
    unfinished = len(started - set(ended))
    interrupted = sum(1 for e in ended.values() if e.data.get("interrupted"))
    console.print(f"{len(started)} tuning session(s): {len(started) - unfinished - interrupted} finished, "
                  f"{interrupted} interrupted, {unfinished} without an end (killed)")
    return 0


def _short_target(target: str) -> str:
    return target if len(target) <= 60 else target[:57] + "..."


def _logs_best(args: argparse.Namespace, console: Any) -> int:
    # start-up: imported on use, so `relay-tune --help` does not load the tuner (~0.1 s)
    from relay_tune.records.database import top_k

    groups = _log_groups(args.logs)
    if args.output:
        # start-up: imported on use, so `relay-tune --help` does not load pandas (~0.3 s)
        from relay_tune.logs import distill

        count = distill(list(args.logs), args.output, top=args.top, overwrite=args.force)
        console.print(f"wrote {count} record(s) ({args.top} best per workload and target) to {args.output}")
        return 0
    for (key, target), records in groups.items():
        for record in top_k(records, args.top):
            gflops = f", {record.gflops:.1f} GFLOPS" if record.gflops is not None else ""
            console.print(f"{key[:12]} {record.description} [{_short_target(target)}]: "
                          f"{_duration(record.cost)}{gflops}")
            console.print(f"    {record.config.canonical_json}")
    return 0


def _logs_merge(args: argparse.Namespace, console: Any) -> int:
    # start-up: imported on use, so `relay-tune --help` does not load pandas (~0.3 s)
    from relay_tune.logs import distill, merge

    if not args.output:
        raise RelayTuneError("logs merge needs -o OUT.jsonl (logs are never merged in place)")
    try:
        if args.best:
            count = distill(list(args.logs), args.output, top=1, overwrite=args.force)
            what = "best record per workload and target"
        else:
            count = merge(list(args.logs), args.output, overwrite=args.force)
            what = "every record, exact duplicates dropped"
    except FileExistsError:
        raise RelayTuneError(f"{args.output} exists; choose another output or pass --force to replace it") from None
    except ValueError as err:
        raise RelayTuneError(str(err)) from None
    console.print(f"wrote {count} record(s) to {args.output} ({what})")
    return 0


def _logs_other(args: argparse.Namespace, console: Any) -> int:
    # start-up: imported on use, so `relay-tune --help` does not load the tuner (~0.1 s)
    from relay_tune.tuning.study_logs import LOG_ACTIONS

    return LOG_ACTIONS[args.action](args, console)


_LOG_ACTIONS: dict[str, Callable[[argparse.Namespace, Any], int]] = {
    "summary": _logs_summary, "best": _logs_best, "merge": _logs_merge, "export": _logs_other, "plot": _logs_other,
}


# -------------------------------------------------------------------------------------------------
# the per-user tuning cache
# -------------------------------------------------------------------------------------------------


def _tuning_cache(args: argparse.Namespace) -> Any:
    """The tuning cache the command uses: --cache DIR, else the user's; None with --no-cache."""
    # start-up: imported on use, so `relay-tune --help` does not load the tuner's records and database (~0.1 s)
    from relay_tune.records.cache import TuningCache

    if getattr(args, "no_cache", False):
        return None
    return TuningCache(args.cache) if getattr(args, "cache", None) else TuningCache.default()


_CACHE_DIR_HELP = ("tuning cache folder (default: $RELAY_TUNE_CACHE, else $XDG_CACHE_HOME/relay-tune, else "
                   "~/.cache/relay-tune)")


def _add_cache_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache", metavar="DIR", help=_CACHE_DIR_HELP)
    p.add_argument("--no-cache", action="store_true", help="neither read nor add to the tuning cache")


@_command("cache")
def cmd_cache(args: argparse.Namespace) -> int:
    # start-up: imported on use, so `relay-tune --help` does not load rich's markup or the tuner's records (~0.1 s)
    from rich.markup import escape

    # start-up: as above (the tuner's records)
    from relay_tune.records.log_format import LogWarning

    console = _console()
    cache = _tuning_cache(args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LogWarning)
        code = _CACHE_ACTIONS[args.action](args, cache, console)
    for message in dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, LogWarning)):
        console.print(f"[yellow]warning:[/yellow] {escape(message)}", highlight=False, soft_wrap=True)
    return code


def _cache_list(args: argparse.Namespace, cache: Any, console: Any) -> int:
    # start-up: imported on use, so `relay-tune --help` does not load rich's tables or the tuner's records (~0.1 s)
    from rich.table import Table

    # start-up: as above (the tuner's records)
    from relay_tune.records.log_format import host_cpu_name

    entries = cache.entries()
    if not entries:
        console.print(f"the tuning cache {cache.path} is empty")
        return 0
    table = Table(title=f"{sum(e.records for e in entries)} records in {cache.path} (this CPU: {host_cpu_name()})",
                  show_edge=False)
    for col, justify in (("key", "left"), ("workload", "left"), ("target", "left"), ("CPU", "left"),
                         ("trials", "right"), ("best", "right"), ("GFLOPS", "right"), ("last", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for e in entries:
        last = datetime.datetime.fromtimestamp(e.last_timestamp, datetime.UTC).strftime("%Y-%m-%d %H:%M")
        table.add_row(e.workload_key[:12], e.description, _short_target(e.target), e.host_cpu or "-",
                      str(e.records), _duration(e.best_cost), f"{e.best_gflops:.1f}" if e.best_gflops else "-", last)
    console.print(table)
    return 0


def _cache_prune(args: argparse.Namespace, cache: Any, console: Any) -> int:
    # start-up: imported on use, so `relay-tune --help` does not load the tuner's records and database (~0.1 s)
    from relay_tune.records.cache import parse_date
    from relay_tune.records.log_format import host_cpu_name

    if args.keep is None and not args.this_cpu and args.before is None:
        raise RelayTuneError("cache prune needs --keep N, --this-cpu or --before YYYY-MM-DD (what to drop)")
    if args.keep is not None and args.keep < 1:
        raise RelayTuneError(f"--keep must be >= 1, got {args.keep}")
    before = parse_date(args.before) if args.before else None
    kept, dropped = cache.prune(keep_best=args.keep, cpu=host_cpu_name() if args.this_cpu else None, before=before)
    console.print(f"{cache.path}: kept {kept} record(s), dropped {dropped} line(s)")
    return 0


def _cache_export(args: argparse.Namespace, cache: Any, console: Any) -> int:
    # start-up: imported on use, so `relay-tune --help` does not load the tuner's records and database (~0.1 s)
    from relay_tune.records.cache import fastest_per_workload

    if not args.output:
        raise RelayTuneError("cache export needs -o OUT.jsonl")
    out = Path(args.output)
    if out.exists() and not args.force:
        raise RelayTuneError(f"{out} exists; choose another output or pass --force to replace it")
    records = cache.records()
    if args.target:
        # start-up: imported on use, so `relay-tune --help` does not load the compiler (~0.4 s with LLVM)
        from relay_tune.compile import resolve_target

        target = resolve_target(args.target)
        records = [r for r in records if r.target in (target.log_name, str(target))]
    if args.best is not None:
        records = fastest_per_workload(records, args.best)
    if out.exists():
        out.unlink()
    count = cache.export(out, records)
    console.print(f"wrote {count} record(s) of {cache.path} to {out}")
    return 0


_CACHE_ACTIONS: dict[str, Callable[[argparse.Namespace, Any, Any], int]] = {
    "list": _cache_list, "prune": _cache_prune, "export": _cache_export,
}


def _add_cache_parser(sub: Any) -> None:
    p = sub.add_parser(
        "cache", help="list, prune or export the per-user tuning cache",
        description="The tuning cache holds every valid record measured by `relay-tune` tuning runs of this user "
        "(one JSON-lines file, the tuning logs' format). A tuning run adds its records to it and does not tune again "
        "a workload the cache has records of for the same target and CPU model (unless --retune); `relay-tune "
        "build` and the tuner's build also use its fastest records. Records of other targets or CPUs are kept but "
        "not used. list (the default): per workload, target and CPU, the trials and the best time. prune: drop "
        "records (--keep N best per workload, target and CPU; --this-cpu: drop other CPU models; --before DATE). "
        "export: the records (--target, --best N) to a log (-o).")
    p.add_argument("action", nargs="?", default="list", choices=sorted(_CACHE_ACTIONS),
                   help="list (default), prune or export")
    p.add_argument("--cache", metavar="DIR", help=_CACHE_DIR_HELP)
    p.add_argument("--keep", type=int, metavar="N", help="prune: keep the N fastest records per workload, target and "
                   "CPU model")
    p.add_argument("--this-cpu", action="store_true", help="prune: drop the records of other CPU models")
    p.add_argument("--before", metavar="YYYY-MM-DD", help="prune: drop records measured before this date (UTC)")
    p.add_argument("-o", "--output", metavar="OUT.jsonl", help="export: the log to write")
    p.add_argument("--target", help="export: only the records of this target (e.g. llvm)")
    p.add_argument("--best", type=int, metavar="N", help="export: only the N fastest per workload, target and CPU")
    p.add_argument("--force", action="store_true", help="export: replace OUT when it exists")


def _add_tune_parser(sub: Any) -> None:
    p = sub.add_parser(
        "tune", help="tune a model and build it from the tuning log (also: relay-tune MODEL --trials N)",
        description="Tune every fused workload of a model within one budget of measured trials, append each "
        "measurement to a JSON-lines tuning log, then build the model from the best records and compare its "
        "latency with the untuned build. The log is the state: the same command resumes an interrupted run, a "
        "larger --trials continues a finished one, and trials already in the log count against the budget. "
        "Ctrl-C stops cleanly (exit code 130) and keeps every measurement. Every run also adds its valid records "
        "to the per-user tuning cache (`relay-tune cache --help`), and a workload the cache has records of for "
        "this target and CPU model is not tuned again (unless --retune) when this log has none of it.")
    _add_model_args(p)
    p.add_argument("--trials", type=int, default=200,
                   help="measured trials in total, shared by all tasks (default 200)")
    p.add_argument("--target", default="llvm", help="target (default: llvm, this CPU; e.g. 'llvm -num-cores=1', "
                   "'cuda' for this machine's NVIDIA GPU)")
    p.add_argument("--log", metavar="PATH", help="tuning log to append to (default: logs/<model>.<target>.jsonl)")
    p.add_argument("--storage", metavar="URL", help="Optuna storage: a journal file path or a database URL "
                   "(default: <log>.optuna.journal beside the log)")
    p.add_argument("--timeout", type=float, metavar="S", help="stop tuning after S seconds and build from what "
                   "was measured")
    p.add_argument("--jobs", type=int, metavar="N", help="parallel build processes (default: one per core)")
    p.add_argument("--seed", type=int, default=0, help="seed of the search and the task scheduler (default 0)")
    p.add_argument("--search", choices=SEARCH_STRATEGIES, default="xgb",
                   help="search strategy: xgb (an XGBoost cost model trained on the measurements picks what to "
                   "measure; saved beside the log as <log>.xgb.json), tpe (Optuna's TPE sampler) or random "
                   "(default xgb)")
    p.add_argument("--scheduler", choices=SCHEDULERS, default="gradient",
                   help="how the trials are shared between tasks: gradient (the rounds go to the tasks whose "
                   "improvement cuts the estimated model latency most) or round-robin (every task in turn) "
                   "(default gradient)")
    p.add_argument("--transfer-from", nargs="+", action="extend", default=[], metavar="LOG",
                   help="earlier tuning logs (files, folders or quoted glob patterns) whose measurements of other "
                   "workloads, models or targets of the same kind warm the xgb cost model")
    p.add_argument("-o", "--output", metavar="FILE.rtmod", help="where to save the built model (default: beside "
                   "the log)")
    p.add_argument("--tasks", metavar="SUBSTR", help="tune only tasks whose workload contains SUBSTR (or whose key "
                   "starts with it)")
    p.add_argument("--no-check", action="store_true", help="measure kernels without comparing their outputs with "
                   "the reference interpreter (for models it cannot run; the log records that the check was off)")
    _add_cache_args(p)
    p.add_argument("--retune", action="store_true", help="tune tasks the tuning cache already has records of "
                   "(by default a workload tuned before on this target and CPU model is not tuned again)")

    p = sub.add_parser("logs", help="summarise, pick the best of, merge, export or plot tuning logs",
                       description="Work with JSON-lines tuning logs, or with the records of a tuning database "
                       "(--storage postgresql://...). summary (the default): one row per workload and target. "
                       "best: the fastest records (written to -o as a log, or printed). merge: several logs into "
                       "one (-o), keeping every record or only the best per workload and target (--best). export: "
                       "every record of --storage to a log (-o). plot: best-so-far per task and the estimated "
                       "end-to-end latency over time, as an image (-o curves.png).")
    p.add_argument("action", nargs="?", default="summary", metavar="ACTION",
                   help=f"what to do: {', '.join(sorted(_LOG_ACTIONS))} (default summary)")
    p.add_argument("logs", nargs="*", metavar="LOG", help="tuning logs (.jsonl)")
    p.add_argument("--storage", metavar="URL", help="a tuning database (postgresql://USER@HOST/DB) instead of logs")
    p.add_argument("-o", "--output", metavar="OUT.jsonl", help="log to write (best, merge); never one of the inputs")
    p.add_argument("--best", action="store_true", help="merge: keep only the best record per workload and target")
    p.add_argument("--top", type=int, default=1, help="best: records per workload and target (default 1)")
    p.add_argument("--force", action="store_true", help="replace OUT when it exists")


# -------------------------------------------------------------------------------------------------
# Argument parsing
# -------------------------------------------------------------------------------------------------

DESCRIPTION = """\
relay-tune compiles and auto-tunes deep-learning models written in the Relay text format (or ONNX).

The main form tunes a model: it extracts one tuning task per distinct fused operator, explores each
task's schedule space with Optuna guided by an XGBoost cost model trained on real measurements, appends
every measurement to a JSON-lines tuning log, and builds the model from the best records:

    relay-tune model.relay --trials 500

The bundled example (the README's Quickstart), from the repository root:

    relay-tune relay_tune/examples/small_resnet.relay --trials 64

Other commands work on models and logs; `relay-tune COMMAND --help` explains each.
"""


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model file: Relay text (.relay) or ONNX (.onnx)")
    p.add_argument(
        "--consts",
        metavar="FILE",
        help="constants for meta[relay.Constant][i]: a .consts.json (shapes; random values) or .npz (values). "
        "Default: the file beside the model with the same stem, if any",
    )
    p.add_argument("--opt-level", type=int, default=3, choices=range(4), help="graph optimisation level (default 3)")
    _add_shape_arg(p)
    p.add_argument("--params", metavar="FILE.npz", help="values for model inputs (by input name) to bind as "
                   "constants: weights given this way are packed once, at build time")
    p.add_argument("--layout-planning", action=argparse.BooleanOptionalAction, default=None,
                   help="plan channel-blocked (NCHW16c on AVX-512) activation layouts for convolution chains on CPU "
                   "targets (default: on); tuning, `tasks` and `build` must agree for logs to match")
    p.add_argument("--winograd", choices=("auto", "on", "off", "f2", "f4"), default=None,
                   help="3x3 stride-1 convolutions on planned layouts as Winograd transforms around a batched product: "
                   "auto (the measured rule: maps of 14x14 or more, 64 input channels or more), on (all), off, f2 / "
                   "f4 (all, one tile size); default: auto. Like --layout-planning, tuning and builds must agree")
    p.add_argument("--precision", choices=("fp32", "bf16", "bf16-emulated"), default="fp32",
                   help="what convolutions and dense products compute in: fp32 (default), bf16 (bfloat16 weights "
                   "and activations, fp32 sums; needs a CPU with AVX512_BF16), bf16-emulated (the same on any CPU, "
                   "bf16 pairs widened to fp32: bf16's numerics, not its speed). Tuning and builds must agree")


def _add_shape_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", action="append", default=[], type=_shape_override, metavar="NAME=D0,D1,...",
                   help="fix the shape of a model input whose dimensions are symbolic or unknown (repeatable), "
                   "e.g. --shape input=1,3,224,224")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relay-tune", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )

    parser.add_argument("--version", action="version", version=f"relay-tune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("check", help="parse and type-check a model; print it typed (or a summary)",
                       description="Parse and type-check a model and print the typed program.")
    _add_model_args(p)
    p.add_argument("--summary", action="store_true", help="print operator counts, parameters and FLOPs instead")
    p.add_argument("--fused", action="store_true", help="run the graph passes and print the fused program")
    p.add_argument("--no-types", action="store_true", help="do not print /* ty=... */ type comments")

    p = sub.add_parser("tasks", help="list the tuning tasks (distinct fused workloads) of a model",
                       description="Optimise and fuse a model, then list one tuning task per distinct workload.")
    _add_model_args(p)
    p.add_argument("--spaces", action="store_true", help="print each task's schedule template family and the size "
                   "of its schedule space instead")
    p.add_argument("--target", default="llvm", help="target of the spaces (--spaces; default: this machine)")

    p = sub.add_parser("import", help="convert an ONNX model to Relay text plus a parameter file",
                       description="Import an ONNX model and write it as Relay text (weights as "
                       "meta[relay.Constant][i]) with their values in <stem>.params.npz beside it.")
    p.add_argument("model", help="the ONNX model (.onnx)")
    p.add_argument("-o", "--output", required=True, metavar="FILE.relay", help="the Relay text file to write")
    _add_shape_arg(p)
    p.add_argument("--no-types", action="store_true", help="do not write /* ty=... */ type comments")

    p = sub.add_parser("build", help="compile a model into one file (.rtmod) that `relay-tune run` loads",
                       description="Optimise, fuse and compile a model with tuned schedules from the logs (default "
                       "schedules for tasks without a record) and save it as one file.")
    _add_model_args(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE.rtmod", help="the compiled model file to write")
    p.add_argument("--target", default="llvm", help="target string (default: llvm, this machine; e.g. "
                   "'llvm -num-cores=1')")
    p.add_argument("--log", action="append", default=[], metavar="FILE.jsonl",
                   help="tuning log to take the best schedules from (repeatable)")
    p.add_argument("--jobs", type=int, default=None, help="compile processes (default: one per core, at most 4)")
    p.add_argument("--require-tuned", action="store_true", help="fail when a task has no tuning record")
    p.add_argument("--no-check-tuned", action="store_true", help="use every tuning record without timing it in the "
                   "model against the default schedule (by default a record slower in the model is not used)")
    p.add_argument("--storage", metavar="URL", help="also take the best schedules from the records of a tuning "
                   "database (postgresql://USER@HOST/DB): the global best of every worker")
    _add_cache_args(p)  # the build also takes the tuning cache's best records for this target and CPU

    p = sub.add_parser("run", help="run a compiled model (.rtmod) and time it",
                       description="Load a compiled model, run it on inputs from an .npz file (random inputs by "
                       "default), print the output shapes and the latency.")
    p.add_argument("model", help="compiled model file (.rtmod) written by `relay-tune build`")
    p.add_argument("others", nargs="*", metavar="OTHER",
                   help="more compiled models of the same inputs: each is checked against the first model's outputs "
                   "and all are timed in the same interleaved rounds (what a before/after comparison needs: runs in "
                   "separate processes at separate times see different machine load), with each one's ratio to "
                   "the first")
    p.add_argument("--inputs", metavar="FILE.npz", help="input arrays by input name (default: random inputs)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--repeat", type=int, default=None,
                   help="timed runs after a 0.2 s warm-up (default: nine rounds of single runs that fill about a "
                        "second, at least 5 a round, timed as the tuner times each build; 0: no timing)")
    p.add_argument("--number", type=int, default=1, help="back-to-back runs per timing (default 1)")
    p.add_argument("--profile", type=int, nargs="?", const=10, default=0, metavar="N",
                   help="also print the N slowest kernels (default 10): their time in the model")
    p.add_argument("--log", action="append", default=[], metavar="FILE.jsonl",
                   help="with --profile: show each kernel's best time in these tuning logs beside its time per call "
                   "in the model (repeatable)")
    p.add_argument("--output", metavar="FILE.npz", help="write the outputs to an .npz file")
    _add_tune_parser(sub)
    _add_cache_parser(sub)
    return parser


def _normalize_argv(argv: Sequence[str]) -> list[str]:
    """`relay-tune model.relay ...` (no command) means `relay-tune tune model.relay ...`."""
    args = list(argv)
    if args and not args[0].startswith("-") and args[0] not in _COMMANDS and "tune" in _COMMANDS:
        return ["tune", *args]
    return args


@contextlib.contextmanager
def _interrupt_first() -> Iterator[None]:
    """An error raised while a KeyboardInterrupt was being handled becomes that KeyboardInterrupt again."""
    try:
        yield
    except Exception as err:
        if raised_by_interrupt(err):
            raise KeyboardInterrupt from err
        raise


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv:
        parser.print_help()
        return EXIT_USAGE
    args = parser.parse_args(_normalize_argv(argv))
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    # start-up: imported on use, so `relay-tune --help` does not load LLVM's targets (~0.04 s) nor the IR
    from relay_tune.frontend.input_shapes import InputShapeError
    from relay_tune.target import TargetError

    try:
        with _interrupt_first():
            return _COMMANDS[args.command](args)
    except (TargetError, InputShapeError) as err:  # a bad --target or --shape: exit code 2, like argparse's own
        print(f"relay-tune: {err}", file=sys.stderr)
        return EXIT_USAGE
    except RelayTuneError as err:
        print(f"relay-tune: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("relay-tune: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (OSError, UnicodeDecodeError) as err:
        print(f"relay-tune: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
