"""The `relay-tune` command line.

    relay-tune model.relay --trials 500      tune a model, write the log, build it from the log
    relay-tune check model.relay             parse + type-check, print the typed program
    relay-tune tasks model.relay             the tuning tasks of the fused model

User mistakes (bad files, parse and type errors, bad options) end with one clear message and exit code 1
(2 for command-line usage errors); never a Python traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from relay_tune.errors import RelayTuneError

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
    from rich.console import Console

    return Console(highlight=False)


# -------------------------------------------------------------------------------------------------
# Loading models
# -------------------------------------------------------------------------------------------------


def load_model(path: str, consts: str | None = None, seed: int = 0) -> Any:
    """Parse a model file (Relay text, or ONNX by extension) and type-check it."""
    from relay_tune.type_infer import infer_types

    p = Path(path)
    if not p.is_file():
        raise RelayTuneError(f"{path}: no such file")
    if p.suffix == ".onnx":
        from relay_tune.frontend import from_onnx

        mod, _params = from_onnx(p)  # the module embeds the weights; params index them for files
    else:
        from relay_tune.text import load_module

        mod = load_module(p, consts=consts, seed=seed)
    return infer_types(mod)


# -------------------------------------------------------------------------------------------------
# check
# -------------------------------------------------------------------------------------------------


@_command("check")
def cmd_check(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    mod = load_model(args.model, args.consts)
    elapsed = time.perf_counter() - start
    if args.fused:
        from relay_tune.passes import optimize

        mod = optimize(mod, opt_level=args.opt_level)
    if args.summary:
        _print_summary(mod, args.model, elapsed)
        return 0
    from relay_tune.text import print_module

    sys.stdout.write(print_module(mod, show_types=not args.no_types))
    if not sys.stdout.isatty():
        sys.stdout.write("\n")
    return 0


def _print_summary(mod: Any, path: str, elapsed: float) -> None:
    from rich.table import Table

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
    from rich.table import Table

    from relay_tune.passes import optimize
    from relay_tune.passes.extract_tasks import extract_tasks

    mod = optimize(load_model(args.model, args.consts), opt_level=args.opt_level)
    tasks = extract_tasks(mod)
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
    from relay_tune.frontend import from_onnx, params_path, save_params
    from relay_tune.text import print_module

    mod, _params = from_onnx(args.model, shape_overrides=dict(args.shape))
    constants: list[Any] = []
    text = print_module(mod, show_types=not args.no_types, constants_out=constants)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    params_file = save_params(params_path(out), constants)
    main = mod["main"]
    console = _console()
    console.print(f"wrote {out} ({len(main.params)} input(s), {len(constants)} constant(s)) and {params_file}")
    return 0


# -------------------------------------------------------------------------------------------------
# Argument parsing
# -------------------------------------------------------------------------------------------------

DESCRIPTION = """\
relay-tune compiles and auto-tunes deep-learning models written in the Relay text format (or ONNX).

The main form tunes a model: it extracts one tuning task per distinct fused operator, explores each
task's schedule space with Optuna guided by an XGBoost cost model trained on real measurements, appends
every measurement to a JSON-lines tuning log, and builds the model from the best records:

    relay-tune model.relay --trials 500

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relay-tune", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    from relay_tune import __version__

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

    p = sub.add_parser("import", help="convert an ONNX model to Relay text plus a parameter file",
                       description="Import an ONNX model and write it as Relay text (weights as "
                       "meta[relay.Constant][i]) with their values in <stem>.params.npz beside it.")
    p.add_argument("model", help="the ONNX model (.onnx)")
    p.add_argument("-o", "--output", required=True, metavar="FILE.relay", help="the Relay text file to write")
    p.add_argument("--shape", action="append", default=[], type=_shape_override, metavar="NAME=D0,D1,...",
                   help="fix the shape of a graph input (repeatable), e.g. --shape input=1,3,224,224")
    p.add_argument("--no-types", action="store_true", help="do not write /* ty=... */ type comments")
    return parser


def _normalize_argv(argv: Sequence[str]) -> list[str]:
    """`relay-tune model.relay ...` (no command) means `relay-tune tune model.relay ...`."""
    args = list(argv)
    if args and not args[0].startswith("-") and args[0] not in _COMMANDS and "tune" in _COMMANDS:
        return ["tune", *args]
    return args


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
    try:
        return _COMMANDS[args.command](args)
    except RelayTuneError as err:
        print(f"relay-tune: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("relay-tune: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (OSError, UnicodeDecodeError) as err:
        print(f"relay-tune: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
