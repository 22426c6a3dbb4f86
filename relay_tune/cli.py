"""The `relay-tune` command line (filled in as the pipeline grows)."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    raise SystemExit("relay-tune: the command line is not built yet")
