"""The Relay text format: parser, printer and file loading.

    mod = parse_module(text, constants=[...])           # or load_module("model.relay")
    text = print_module(mod, constants_out=consts)      # parse_module(text, constants=consts) == mod

Errors in the input are `relay_tune.errors.ParseError`s that show the offending line with a caret.
"""

from relay_tune.text.loader import load_constants_sidecar, load_module, sidecar_path
from relay_tune.text.parser import (
    parse_expr,
    parse_module,
    parse_module_bytes,
    parse_module_with_annotations,
    parse_type,
)
from relay_tune.text.printer import print_expr, print_module, print_type

__all__ = [
    "load_constants_sidecar",
    "load_module",
    "parse_expr",
    "parse_module",
    "parse_module_bytes",
    "parse_module_with_annotations",
    "parse_type",
    "print_expr",
    "print_module",
    "print_type",
    "sidecar_path",
]
