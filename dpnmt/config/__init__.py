"""A run's configuration: frozen, typed sections parsed once from the ConfigDict edge.

`RunConfig.parse(config_dict)` is the one way in: the ConfigDict (from
`--config=file.py:variant`, `--config.x=` overrides or a run's config.json)
becomes `RunConfig(data, tokenizer, model, dp, train, eval)`, with every
problem raised at once. `config_lib` builds the ConfigDict; this package reads it.
"""

from dpnmt.config.fields import (
    check_override_flags,
    config_fields,
    flatten,
    lot_size,
    unknown_field_message,
)
from dpnmt.config.run import RunConfig
from dpnmt.config.sections import (
    DataConfig,
    EvalConfig,
    ModelConfig,
    PrivacyConfig,
    TokenizerConfig,
    TrainConfig,
)

__all__ = [
    "DataConfig",
    "EvalConfig",
    "ModelConfig",
    "PrivacyConfig",
    "RunConfig",
    "TokenizerConfig",
    "TrainConfig",
    "check_override_flags",
    "config_fields",
    "flatten",
    "lot_size",
    "unknown_field_message",
]
