"""The decoding flags `dpnmt.decode` and `dpnmt.translate` share, and their one check.

Each flag left out keeps the recorded setting: a run's `eval` section, an
export's `dpnmt.json` (`release.load_translator`). A given flag is checked by
`EvalConfig.problems`, the rule the config's `eval` fields follow, and a bad
one is named by its flag in one line before anything loads. Decoding is
post-processing of the released model (no privacy cost): choose it on a
public validation split, never on test.
"""

import dataclasses
from typing import Any

from absl import flags

from dpnmt.config import EvalConfig
from dpnmt.errors import ConfigError

NUM_BEAMS = flags.DEFINE_integer(
    "num_beams", None, "Beams (1: greedy). Default: the run's eval.num_beams or the export's."
)
LENGTH_PENALTY = flags.DEFINE_float(
    "length_penalty",
    None,
    "Beam search's length penalty (scores / length^lp; > 0 favours longer). Default: recorded.",
)
NO_REPEAT_NGRAM_SIZE = flags.DEFINE_integer(
    "no_repeat_ngram_size",
    None,
    "n > 0: no n-gram twice in a translation (0: no ban). Default: recorded.",
)
_SHARED = {
    "num_beams": NUM_BEAMS,
    "length_penalty": LENGTH_PENALTY,
    "no_repeat_ngram_size": NO_REPEAT_NGRAM_SIZE,
}


def overrides(**more: tuple[str, Any]) -> dict[str, Any]:
    """The `EvalConfig` fields the shared flags (and `more`) set, checked.

    Args:
        **more: An app's own decoding flags, as field=(flag name, value),
            e.g. max_new_tokens=("max_length", 64); a None value is not set.

    Returns:
        {field: value} of the flags given.

    Raises:
        ConfigError: One line naming each bad flag and what it must be.
    """
    named = {field: (field, holder.value) for field, holder in _SHARED.items()} | more
    given = {field: value for field, (_, value) in named.items() if value is not None}
    problems = dataclasses.replace(EvalConfig(), **given).problems()
    for field, (flag, value) in named.items():  # eval.<field>=... -> --<flag>=...
        prefix = f"{EvalConfig.NAME}.{field}={value!r}"
        problems = [p.replace(prefix, f"--{flag}={value}", 1) for p in problems]
    if problems:
        raise ConfigError(" ".join(problems))
    return given
