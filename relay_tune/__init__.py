"""relay-tune: a Relay deep-learning compiler and auto-tuner."""

from typing import Any

from relay_tune.errors import ParseError, RelayTuneError, RelayTypeError
from relay_tune.version import __version__

__all__ = ["ParseError", "RelayTuneError", "RelayTypeError", "__version__", "bind_params", "build"]


def __getattr__(name: str) -> Any:
    # `relay_tune.build(mod, ...)` and `relay_tune.bind_params(mod, {"weight": array})` are the model compiler's
    # functions (`relay_tune.compile`), looked up on first use. Start-up cost: the compiler pulls in LLVM and the
    # whole pipeline (about 0.1 s), which `import relay_tune.ir` and `relay-tune --help` must not pay.
    if name in ("build", "bind_params"):
        from relay_tune import compile as model_compiler  # start-up cost (see above)

        return getattr(model_compiler, name)
    raise AttributeError(f"module 'relay_tune' has no attribute {name!r}")
