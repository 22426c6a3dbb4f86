"""`python -m relay_tune` is the `relay-tune` command."""

from relay_tune.cli import main

raise SystemExit(main())
