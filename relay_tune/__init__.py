"""relay-tune: a Relay deep-learning compiler and auto-tuner."""

from relay_tune.errors import ParseError, RelayTuneError, RelayTypeError

__version__ = "0.1.0"

__all__ = ["ParseError", "RelayTuneError", "RelayTypeError", "__version__", "bind_params", "build"]


def __getattr__(name: str) -> object:
    # `relay_tune.build(mod, ...)`, imported on first use: the compiler pulls in LLVM and the whole pipeline.
    # The module `relay_tune.build` is itself callable (it forwards to its `build` function), so the attribute
    # stays callable after the submodule has been imported.
    if name == "build":
        import importlib

        return importlib.import_module("relay_tune.build")
    if name == "bind_params":  # `relay_tune.bind_params(mod, {"weight": array})`: inputs become constants
        from relay_tune.build import bind_params

        return bind_params
    raise AttributeError(f"module 'relay_tune' has no attribute {name!r}")
