"""Concatenated pairs: longer training examples joined from short PUBLIC pairs.

A model trained on short sentences does not carry over to longer inputs: the
public model (Tatoeba's pairs of up to about 6 words, plus the WMT sample)
translated Multi30K's captions (about 12 words) at 0.98 BLEU zero-shot, from
3.5 on captions under 7 German words down to 0.2 on those of 17 or more, and
answered long captions in the WMT sample's parliamentary register ("Mr
President, ..."), the only long sentences it had seen. Concatenation
augmentation (Nguyen et al., 2021, "Data augmentation by concatenation for
low-resource translation") adds examples made of several short pairs joined
side by side, so that long inputs in the everyday register are seen too.

`data.concat_weight` w > 0 adds round(w * N) examples to the train split of N
pairs (after `data.max_train_examples`), each the concatenation, in the same
order on both sides, of k short pairs with k different source sentences, k
uniform in 2..`data.concat_max_pairs` = m; sides are joined by a space (by
nothing for languages written without spaces, e.g. Japanese). Short: both
sides non-empty and at most (`data.concat_max_chars` - m + 1) / m characters,
so that a joined side, spaces included, has at most `concat_max_chars`
characters (the WMT sample's long sentences are mostly left out, and a joined
example is rarely truncated); the first row of each source sentence only, so
that no example repeats one (Tatoeba lists several translations of some). The
pairs kept as they are and the new examples are shuffled together. Every draw
comes from the fixed, public `CONCAT_SEED`: the data is public.

Non-private runs only (`dpnmt.data.checks`): a pair in several examples is
one record in several rows of a lot, which the per-example bound C of DP-SGD
does not cover.
"""

import datasets
import numpy as np

from dpnmt.data.corpora.common import translation_features
from dpnmt.data.groups import GROUP_COLUMN
from dpnmt.data.languages import LanguagePair, parse_pair
from dpnmt.errors import ConfigError

CONCAT_SEED = 0  # Fixed: which public pairs are joined is public.
# Written without spaces between words: their sides are joined directly.
UNSPACED_LANGUAGES = frozenset({"ja", "zh", "th", "my", "km", "lo"})


def joiner(language: str) -> str:
    """What goes between two sentences of `language` in a concatenated example."""
    return "" if language.split("_")[0].lower() in UNSPACED_LANGUAGES else " "


def _short(text: str | None, longest: int) -> bool:
    text = (text or "").strip()
    return 0 < len(text) <= longest


def _candidates(rows, sides: tuple[str, str], longest: int) -> list[int]:
    """Short pairs' rows, the first of each source sentence (a group never repeats one)."""
    seen, out = set(), []
    for i, row in enumerate(rows):
        source = (row[sides[0]] or "").strip()
        if source not in seen and all(_short(row[lang], longest) for lang in sides):
            seen.add(source)
            out.append(i)
    return out


def _draw_groups(
    candidates: np.ndarray, count: int, max_pairs: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """`count` groups of 2..max_pairs distinct rows of `candidates`, k uniform per group."""
    sizes = rng.integers(2, max_pairs + 1, size=count)
    return [candidates[rng.choice(len(candidates), size=k, replace=False)] for k in sizes]


def for_data(train: datasets.Dataset, data) -> datasets.Dataset:
    """`train` with the `data` section's concatenated pairs (`train` itself at weight 0)."""
    if not data.concat_weight:
        return train
    return concatenate_pairs(
        train,
        parse_pair(data.pair),
        data.concat_weight,
        data.concat_max_pairs,
        data.concat_max_chars,
    )


def concatenate_pairs(
    train: datasets.Dataset,
    pair: LanguagePair,
    weight: float,
    max_pairs: int,
    max_chars: int,
    *,
    seed: int = CONCAT_SEED,
) -> datasets.Dataset:
    """`train` and round(weight * len(train)) concatenated examples, shuffled together.

    Args:
      train: a translation train split (a `translation` column of {lang: text}).
      pair: its direction (the two languages joined).
      weight: new examples per train pair, > 0.
      max_pairs: most pairs in one new example, >= 2.
      max_chars: most characters of a joined side; each pair joined has at most
        (max_chars - max_pairs + 1) // max_pairs a side.
      seed: the draws' seed (public).

    Returns:
      The split with `translation` ({source, target} only) and
      len(train) + round(weight * len(train)) rows; its description says how
      many were joined and how.

    Raises:
      ConfigError: the split names privacy groups, or has fewer than
        `max_pairs` short pairs.
    """
    if GROUP_COLUMN in train.column_names:
        raise ConfigError(
            "data.concat_weight: the train split names privacy groups (a private corpus); "
            "concatenated pairs are for public, non-private training: set "
            "data.concat_weight=0."
        )
    rows = train["translation"]
    sides = (pair.source, pair.target)
    longest = (max_chars - (max_pairs - 1)) // max_pairs  # Room for the joiners.
    usable = np.array(_candidates(rows, sides, longest), np.int64)
    if len(usable) < max_pairs:
        raise ConfigError(  # No count: the split may be private (decode --zero_shot).
            f"data.concat_max_pairs={max_pairs}, data.concat_max_chars={max_chars}: the train "
            f"split has fewer than {max_pairs} pairs with both sides non-empty and at most "
            f"{longest} characters; raise data.concat_max_chars, lower "
            "data.concat_max_pairs, or set data.concat_weight=0."
        )
    rng = np.random.default_rng(seed)
    count = int(round(weight * len(rows)))
    joined = []
    for group in _draw_groups(usable, count, max_pairs, rng):
        joined.append(
            {lang: joiner(lang).join(rows[i][lang].strip() for i in group) for lang in sides}
        )
    kept = [{lang: row[lang] for lang in sides} for row in rows]
    everything = kept + joined
    order = rng.permutation(len(everything))
    description = (
        f"{train.info.description or 'train'}; + {count} examples each joining 2-{max_pairs} "
        f"of its pairs of <= {longest} characters a side (data.concat_weight={weight:g}, "
        f"seed {seed}), shuffled in"
    )
    features = translation_features(pair)
    return datasets.Dataset.from_dict(
        {"translation": [everything[i] for i in order]},
        features=features,
        info=datasets.DatasetInfo(description=description, features=features),
    )
