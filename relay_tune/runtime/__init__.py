"""Runtime: loading compiled kernels, calling and timing them, and running compiled models."""

from typing import Any


def __getattr__(name: str) -> Any:
    # Lazy: importing the kernel runtime must not pull in the model runtime (and vice versa).
    if name in ("load", "CompiledModel"):
        # start-up: the model runtime (executor, memory plan, ~0.1 s) loads only when a model is loaded
        from relay_tune.runtime import model

        return getattr(model, name)
    raise AttributeError(f"module 'relay_tune.runtime' has no attribute {name!r}")
