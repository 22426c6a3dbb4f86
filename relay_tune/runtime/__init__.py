"""Runtime: running compiled models (the model runtime, the executor, the profiler, the GPU runtime)."""

from typing import Any


def __getattr__(name: str) -> Any:
    # Lazy: importing one part of the runtime (the executor, the GPU runtime) must not pull in the model runtime.
    if name in ("load", "CompiledModel"):
        # start-up: the model runtime (executor, memory plan, ~0.1 s) loads only when a model is loaded
        from relay_tune.runtime import model

        return getattr(model, name)
    raise AttributeError(f"module 'relay_tune.runtime' has no attribute {name!r}")
