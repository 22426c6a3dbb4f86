"""relay-tune: a Relay deep-learning compiler and auto-tuner."""

from relay_tune.errors import ParseError, RelayTuneError, RelayTypeError

__version__ = "0.1.0"

__all__ = ["ParseError", "RelayTuneError", "RelayTypeError", "__version__"]
