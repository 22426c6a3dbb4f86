"""Schedule search spaces: knob kinds, `Space` (knobs + constraints) and `Config` (one point, stable key)."""

from search_space.config import Config, ConfigValue, InvalidConfigError, JSONValue, config_key
from search_space.knobs import BoolKnob, ChoiceKnob, IntKnob, Knob, SplitKnob, split_candidates
from search_space.space import Constraint, Space

__all__ = [
    "BoolKnob",
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
    "split_candidates",
]
