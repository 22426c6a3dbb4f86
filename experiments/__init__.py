"""relay-tune's benchmarks, one entry point: `python -m experiments <subcommand>` from the repository root.

Each subcommand is a module of this package with `add_arguments(parser)` and `run(args) -> int`; what each
measures, the exact commands and the results so far are in experiments/README.md. Every timing goes through
`experiments.timing` (interleaved rounds, warmed, repeated; medians and spread).
"""


class UsageError(Exception):
    """Bad input from the command line: `python -m experiments` reports it in one line and exits with 2."""
