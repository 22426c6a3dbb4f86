"""Schedule search spaces: knob kinds, `Space` (knobs + constraints) and `Config` (one point, stable key).

The templates live in submodules: `search_space.families` (CPU, one module per operator family),
`search_space.gpu` (CUDA), `search_space.defaults` (the untuned schedule) and `search_space.decode`
(`config_to_steps(func, config, target)`: a logged config back into schedule steps). The package itself imports
none of them, so the record store can read `Config` without loading the templates and the code generators.
"""

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
