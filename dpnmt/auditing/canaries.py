"""Secret canary sentence pairs for privacy auditing, and their exposure.

A canary is one sentence pair made from two templates: the source names a
random public-looking KEY, the target carries a random SECRET, e.g.

    source: "customer 4 7 1 9 account number"
    target: "my account number is 0 3 8 2"

The secret appears only in the target, so a model can give it a high
likelihood only by memorising the pair; were it also in the source, a model
that learnt to copy digits would rank every canary's secret first, inserted or
not, and exposure would measure translation instead of memorisation. Keys are
distinct, so each source identifies its canary.

Fills are decimal digits separated by spaces, one word per digit. Every
tokenizer here encodes them injectively without `unk`: pretrained T5/mBART
vocabularies hold the digits, and SentencePiece vocabularies learnt here (DP or
not) use byte fallback, so a digit the vocabulary lacks is still encoded, as
its byte. `dpnmt.auditing.scoring` checks this for the run's tokenizer (distinct
candidates must get distinct ids, none `unk`) and refuses to score otherwise,
and exposure counts ties against the secret, so it can only be understated.

One-run audit (Steinke, Nasr & Jagielski 2023): each canary is inserted with
probability 1/2, by an independent fair coin, else held out; the audit's
p-values assume exactly these coins, so the held-out fraction is not a knob.
Which canaries were inserted, and their secrets, are private.
"""

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

DIGITS = "0123456789"
KEY, SECRET = "{key}", "{secret}"
SOURCE_TEMPLATE = "customer {key} account number"
TARGET_TEMPLATE = "my account number is {secret}"


@dataclasses.dataclass(frozen=True)
class Canary:
    """One canary sentence pair (private: it holds the secret).

    Attributes:
      index: position in the canary list.
      key: the source's fill (spaced digits), distinct across canaries.
      secret: the target's fill (spaced digits).
      inserted: True if it is in the training data, False if held out.
      source: the source sentence.
      target: the target sentence.
    """

    index: int
    key: str
    secret: str
    inserted: bool
    source: str
    target: str


def spaced_digits(number: int, length: int) -> str:
    """`number` as `length` zero-padded digits separated by spaces (7, 3 -> "0 0 7")."""
    return " ".join(f"{number:0{length}d}")


def check_templates(source_template: str, target_template: str) -> None:
    """Raises ValueError unless the source has one {key} and no {secret}, the target one {secret}.

    Args:
      source_template: text with exactly one "{key}" and no "{secret}".
      target_template: text with exactly one "{secret}" (a "{key}" is allowed).
    """
    if source_template.count(KEY) != 1 or SECRET in source_template:
        raise ValueError(
            f"source_template={source_template!r} needs exactly one {KEY} and no {SECRET}: a "
            "secret in the source could be copied, so its exposure would not measure memorisation."
        )
    if target_template.count(SECRET) != 1:
        raise ValueError(f"target_template={target_template!r} needs exactly one {SECRET}.")
    for name, template in (("source", source_template), ("target", target_template)):
        if not template.replace(KEY, "").replace(SECRET, "").strip():
            raise ValueError(f"{name}_template={template!r} needs words besides its fills.")


def make_canaries(
    num_canaries: int,
    *,
    key_length: int,
    secret_length: int,
    seed: int,
    source_template: str = SOURCE_TEMPLATE,
    target_template: str = TARGET_TEMPLATE,
) -> list[Canary]:
    """Draws canaries: distinct keys, uniform secrets, fair-coin membership.

    Args:
      num_canaries: M, at least 10 (so both groups are non-empty but with
        probability 2^(1-M)).
      key_length: digits per key; 10**key_length must be at least M.
      secret_length: digits per secret; 10**secret_length candidate secrets.
      seed: seed of the numpy generator (private, like the secrets it draws).
      source_template: see `check_templates`.
      target_template: see `check_templates`.

    Returns:
      [M] canaries; about half have `inserted`.

    Raises:
      ValueError: bad counts or templates, or a draw with an empty group.
    """
    check_templates(source_template, target_template)
    if num_canaries < 10:
        raise ValueError(f"num_canaries={num_canaries}: use at least 10 (100s for tight bounds).")
    if key_length < 1 or 10**key_length < num_canaries:
        raise ValueError(
            f"key_length={key_length} gives {10**key_length} keys for {num_canaries} canaries; "
            "raise key_length."
        )
    if secret_length < 1:
        raise ValueError(f"secret_length={secret_length} must be at least 1.")
    rng = np.random.default_rng(seed)
    keys = rng.choice(10**key_length, size=num_canaries, replace=False)
    secrets = rng.integers(0, 10**secret_length, size=num_canaries)
    inserted = rng.random(num_canaries) < 0.5
    if inserted.all() or not inserted.any():
        raise ValueError(
            f"All {num_canaries} canaries fell in one group (chance 2^(1-M)); use another seed."
        )
    canaries = []
    for index, (key, secret, member) in enumerate(zip(keys, secrets, inserted, strict=True)):
        key_text = spaced_digits(int(key), key_length)
        secret_text = spaced_digits(int(secret), secret_length)
        canaries.append(
            Canary(
                index=index,
                key=key_text,
                secret=secret_text,
                inserted=bool(member),
                source=source_template.replace(KEY, key_text),
                target=fill_target(target_template, key_text, secret_text),
            )
        )
    return canaries


def fill_target(target_template: str, key: str, secret: str) -> str:
    """The target sentence for one key and one secret."""
    return target_template.replace(KEY, key).replace(SECRET, secret)


def training_pairs(canaries: Sequence[Canary], repeats: int) -> list[tuple[str, str]]:
    """(source, target) of every inserted canary, each `repeats` times; held-out ones never.

    Args:
      canaries: from `make_canaries`.
      repeats: r >= 1 copies per inserted canary (r = 1 audits the per-example
        guarantee; r > 1 the weaker guarantee for a group of r).

    Returns:
      [r * number inserted] pairs.
    """
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be at least 1.")
    return [(c.source, c.target) for c in canaries if c.inserted for _ in range(repeats)]


def candidate_secrets(
    true_secret: str, secret_length: int, num_candidates: int, rng: np.random.Generator
) -> list[str]:
    """The true secret first, then other secrets drawn uniformly without replacement.

    Args:
      true_secret: the canary's secret (spaced digits).
      secret_length: digits per secret.
      num_candidates: how many OTHER secrets; at least 10**secret_length - 1
        takes all of them (exact exposure).
      rng: numpy generator for the draw.

    Returns:
      [1 + min(num_candidates, 10**secret_length - 1)] distinct secrets.
    """
    space = 10**secret_length
    true_number = int(true_secret.replace(" ", ""))
    if num_candidates >= space - 1:
        others = np.arange(space - 1)
    else:
        others = rng.choice(space - 1, size=num_candidates, replace=False)
    others = others + (others >= true_number)  # Skips the true secret.
    return [true_secret] + [spaced_digits(int(n), secret_length) for n in others]


def exposure(true_log_likelihood: float, other_log_likelihoods: np.ndarray) -> float:
    """Exposure of a secret (Carlini et al. 2019): log2(#candidates) - log2(rank).

    The rank counts the secret and every other candidate at least as likely
    (ties against the secret). Over all 10**s secrets this is the Secret
    Sharer's exposure; over a uniform sample of them it estimates it (the full
    rank is about the sampled rank times 10**s / #candidates), capped at
    log2(#candidates).

    Args:
      true_log_likelihood: log p(target with the true secret | source).
      other_log_likelihoods: [K] the same for the other candidates.

    Returns:
      Exposure in bits, in [0, log2(K + 1)]: about 1.4 on average (1/ln 2) for
      a secret the model has not learnt, the maximum for one it ranks first.
    """
    others = np.asarray(other_log_likelihoods)
    rank = 1 + int(np.sum(others >= true_log_likelihood))
    return math.log2(others.size + 1) - math.log2(rank)
