"""Schedule search spaces: knob kinds, `Space` (knobs + constraints), `Config` (one point, stable key), and
`config_to_steps(func, config, target)`: a (logged) config back into the schedule steps of its family's template
(`search_space.decode`)."""

from typing import Any

from search_space.config import Config, ConfigValue, InvalidConfigError, JSONValue, config_key
from search_space.knobs import BoolKnob, ChoiceKnob, IntKnob, Knob, SplitKnob, split_candidates
from search_space.space import Constraint, Space

__all__ = [
    "BoolKnob",
    "ConfigNotInSpace",
    "ChoiceKnob",
    "Config",
    "ConfigValue",
    "Constraint",
    "IntKnob",
    "InvalidConfigError",
    "JSONValue",
    "Knob",
    "Space",
    "SplitKnob",
    "config_key",
    "config_to_steps",
    "split_candidates",
]


def __getattr__(name: str) -> Any:
    """`config_to_steps` and `ConfigNotInSpace`, imported on first use."""
    if name in ("config_to_steps", "ConfigNotInSpace"):
        # start-up: the decoder imports every template and the kernel layer (~0.4 s); `from search_space import
        # Config` stays light
        from search_space import decode

        return getattr(decode, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
