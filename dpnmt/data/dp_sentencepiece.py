r"""DP-SentencePiece: learn a SentencePiece vocabulary from a DP word histogram.

Algorithm (Ponomareva et al. 2022, "Training text-to-text transformers with privacy
guarantees", Algorithm 1):
  1. Each example is one sentence pair: the words (whitespace split) of its source
     followed by its target, cut to the first `max_words`.
  2. Its histogram counts each word at most `max_count_per_word` (m) times.
  3. Per-example histograms are summed: H(w) for every word w that occurs.
  4. Every H(w) gets independent Gaussian noise N(0, sigma^2), drawn with
     `numpy.random.default_rng(seed)` in sorted word order (reproducible).
  5. Words whose noisy count is not above the threshold C are dropped.
  6. SentencePiece trains on the survivors as TSV `word<TAB>round(noisy count)`,
     with its own DP option OFF (its noise cannot be seeded). Public words (the
     words of the model's task prefix, which every source starts with) join them
     with the largest noisy count: data-independent text and the DP output only,
     so no ε (without them a 2,000-pair vocabulary spelt the T5 prefix in 26 pieces).

Guarantee (Hoory et al. 2021, Theorem 1), for adding or removing one example, and
our reading of the issue's symbols:
  * k = L2 sensitivity: the largest ||h(x)||_2 of one example's histogram,
    sqrt(floor(W/m) * m^2 + (W mod m)^2) for W = max_words (sqrt(W) when m = 1).
  * m = Linf sensitivity = max_count_per_word.
  * Words both neighbours contain: a Gaussian mechanism with sensitivity k, so
    eps = (k / sigma) * sqrt(2 ln(1.25 / (delta/2))) = (k/sigma) sqrt(2 ln(2.5/delta)).
  * Words only the extra example contains (at most W of them, each H <= m) are
    released with probability <= delta/2 in total when
    C = m + sigma * PhiInv(1 - delta / (2 W)), PhiInv the standard normal quantile
    (= sqrt(2) * erfinv(1 - delta / W)).
  Together: (eps, delta)-DP. The issue writes C with sigma * erfinv(1 - delta/(2W));
  for N(0, sigma^2) noise that threshold is too low (it is the quantile of
  N(0, sigma^2 / 2)), so we use the normal quantile, which the union bound needs.
  The eps formula is the classical Gaussian-mechanism bound (Dwork & Roth,
  Theorem A.1), proven for eps < 1; above that it can understate the loss, so the
  record also carries `epsilon_analytic`, the exact Gaussian-mechanism eps at
  delta/2 (Balle & Wang 2018), valid for every eps. Compose the larger of the two.
"""

import collections
import dataclasses
import math
import os
import secrets
import statistics
import tempfile
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from dpnmt.data.spm_training import sentencepiece_trainer_args, train_model
from dpnmt.data.tokenizers import SentencePieceTokenizer, VocabularyRecord
from dpnmt.errors import ConfigError

_SPECIAL_AND_BYTE_PIECES = 3 + 256  # pad, eos, unk; the 256 byte-fallback pieces.


@dataclasses.dataclass(frozen=True)
class DPVocabularyParams:
    """Privacy parameters of DP-SentencePiece, validated on construction.

    Attributes:
      noise_stddev: sigma, standard deviation of the Gaussian noise on each word
        count (in counts).
      delta: total delta of the vocabulary release, in (0, 1).
      max_words: W, words kept per example (source words first, then target).
      max_count_per_word: m, most times one example counts one word.
    """

    noise_stddev: float
    delta: float
    max_words: int
    max_count_per_word: int = 1

    def __post_init__(self):
        if not self.noise_stddev > 0:
            raise ValueError(f"noise_stddev must be > 0, not {self.noise_stddev}.")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), not {self.delta}.")
        if int(self.max_words) != self.max_words or self.max_words < 1:
            raise ValueError(f"max_words must be a positive integer, not {self.max_words}.")
        if (
            int(self.max_count_per_word) != self.max_count_per_word
            or not 1 <= self.max_count_per_word <= self.max_words
        ):
            raise ValueError(
                f"max_count_per_word must be an integer in [1, max_words={self.max_words}], "
                f"not {self.max_count_per_word}."
            )

    @property
    def l2_sensitivity(self) -> float:
        """k: the largest L2 norm of one example's clipped, truncated histogram."""
        full, rest = divmod(self.max_words, self.max_count_per_word)
        return math.sqrt(full * self.max_count_per_word**2 + rest**2)

    @property
    def threshold(self) -> float:
        """C = m + sigma * PhiInv(1 - delta / (2 W)), in counts."""
        quantile = statistics.NormalDist().inv_cdf(1.0 - self.delta / (2.0 * self.max_words))
        return self.max_count_per_word + self.noise_stddev * quantile

    @property
    def epsilon(self) -> float:
        """The issue's formula: eps = (k / sigma) * sqrt(2 ln(2.5 / delta))."""
        return vocabulary_epsilon(self.noise_stddev, self.delta, l2_sensitivity=self.l2_sensitivity)

    @property
    def epsilon_analytic(self) -> float:
        """Exact Gaussian-mechanism eps at delta/2 for noise multiplier sigma / k."""
        return analytic_gaussian_epsilon(self.noise_stddev / self.l2_sensitivity, self.delta / 2)


def vocabulary_epsilon(noise_stddev: float, delta: float, *, l2_sensitivity: float) -> float:
    """Returns (k / sigma) * sqrt(2 ln(2.5 / delta)).

    Args:
      noise_stddev: sigma, in counts.
      delta: total delta (half for the Gaussian part, half for the threshold).
      l2_sensitivity: k.

    Returns:
      eps, a float.
    """
    return (l2_sensitivity / noise_stddev) * math.sqrt(2.0 * math.log(2.5 / delta))


def _log_normal_cdf_of_negative(x: float) -> float:
    """Returns log Phi(-x) for x >= 0, accurate in the far tail."""
    if x < 30:
        return math.log(0.5 * math.erfc(x / math.sqrt(2.0)))
    return -0.5 * x * x - math.log(x) - 0.5 * math.log(2 * math.pi) + math.log1p(-1 / (x * x))


def _gaussian_delta(epsilon: float, noise_multiplier: float) -> float:
    """Smallest delta at which the Gaussian mechanism (sensitivity 1) is (eps, delta)-DP."""
    mu = 1.0 / noise_multiplier
    upper = 0.5 * math.erfc(-(mu / 2 - epsilon / mu) / math.sqrt(2.0))
    a = mu / 2 + epsilon / mu
    lower = math.exp(epsilon + _log_normal_cdf_of_negative(a))
    return upper - lower


def analytic_gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    """Exact eps of the Gaussian mechanism (Balle & Wang 2018, Theorem 8) by bisection.

    Args:
      noise_multiplier: sigma / sensitivity.
      delta: target delta.

    Returns:
      The smallest eps >= 0 with delta(eps) <= delta, to a relative 1e-9.
    """
    if _gaussian_delta(0.0, noise_multiplier) <= delta:
        return 0.0
    low, high = 0.0, 1.0
    while _gaussian_delta(high, noise_multiplier) > delta:
        low, high = high, 2 * high
    while high - low > 1e-9 * high:
        mid = (low + high) / 2
        if _gaussian_delta(mid, noise_multiplier) > delta:
            low = mid
        else:
            high = mid
    return high


def example_word_counts(
    source: str,
    target: str,
    *,
    max_words: int,
    max_count_per_word: int,
    split_words: Callable[[str], list[str]] = str.split,
) -> collections.Counter:
    """One example's histogram: first max_words words of source+target, counts <= m."""
    words = (split_words(source) + split_words(target))[:max_words]
    counts = collections.Counter(words)
    return collections.Counter({w: min(c, max_count_per_word) for w, c in counts.items()})


def word_histogram(
    examples: Iterable[tuple[str, str]],
    *,
    max_words: int,
    max_count_per_word: int = 1,
    split_words: Callable[[str], list[str]] = str.split,
) -> dict[str, int]:
    """Sums the per-example histograms of (source, target) pairs (private: not DP)."""
    total = collections.Counter()
    for source, target in examples:
        total.update(
            example_word_counts(
                source,
                target,
                max_words=max_words,
                max_count_per_word=max_count_per_word,
                split_words=split_words,
            )
        )
    return dict(total)


def noisy_threshold(
    histogram: dict[str, int], *, noise_stddev: float, threshold: float, seed: int
) -> dict[str, float]:
    """Adds N(0, sigma^2) to every count and keeps words whose noisy count exceeds C.

    Args:
      histogram: word -> summed count (words with count 0 must be absent).
      noise_stddev: sigma >= 0, in counts.
      threshold: C, in counts.
      seed: seed of the numpy generator; noise is drawn in sorted word order.

    Returns:
      Surviving word -> noisy count.
    """
    if noise_stddev < 0:
        raise ValueError(f"noise_stddev must be >= 0, not {noise_stddev}.")
    words = sorted(histogram)
    counts = np.array([histogram[w] for w in words], dtype=np.float64)
    noise = np.random.default_rng(seed).normal(0.0, noise_stddev, size=len(words))
    noisy = counts + noise
    return {w: float(c) for w, c in zip(words, noisy, strict=True) if c > threshold}


def with_public_words(survivors: dict[str, float], public_words: Sequence[str]) -> dict[str, float]:
    """The survivors plus `public_words`, each public word at least at the largest noisy count.

    Post-processing of the DP output with data-independent words (e.g. the task
    prefix "translate German to English:" that `preprocess` puts before every
    source): no privacy cost, and the words become whole pieces, not characters.

    Args:
      survivors: word -> noisy count (`noisy_threshold`'s output).
      public_words: words fixed before seeing the data (never read from it).

    Returns:
      word -> count, the survivors' counts kept or raised for the public words.
    """
    if not survivors or not public_words:
        return dict(survivors)
    top = max(survivors.values())
    return {**survivors, **{w: max(top, survivors.get(w, 0.0)) for w in public_words}}


def train_dp_sentencepiece(
    examples: Iterable[tuple[str, str]],
    *,
    vocab_size: int,
    params: DPVocabularyParams,
    seed: int | None = None,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    byte_fallback: bool = True,
    split_words: Callable[[str], list[str]] = str.split,
    public_words: Sequence[str] = (),
    sentinels: int = 0,
) -> tuple[SentencePieceTokenizer, VocabularyRecord]:
    """Trains a SentencePiece model on a DP word histogram of private sentence pairs.

    Args:
      examples: (source, target) pairs of the private training split; one pair is
        one example (the unit of privacy).
      vocab_size: target vocabulary size (smaller if few words survive).
      params: sigma, delta, max_words, max_count_per_word.
      seed: seed of the noise generator (and of SentencePiece's own sampling).
        None (releases) draws one from the OS. It is as private as the data:
        anyone who knows it can regenerate and subtract the noise. Fixed seeds
        are for tests.
      model_type: "unigram" or "bpe" (the DP step is independent of the model type).
      character_coverage: SentencePiece character coverage over surviving words.
      byte_fallback: encode characters of dropped words as bytes (public: 256
        byte pieces), so any text still round-trips.
      split_words: word splitter; the default whitespace split makes each
        unspaced Japanese/Chinese sentence one word (which rarely survives).
      public_words: data-independent words added to the survivors
        (`with_public_words`; the task prefix's), recorded in the details.
      sentinels: T5 sentinel pieces reserved (span corruption; data-independent).

    Returns:
      (tokenizer, record) with epsilon, delta, epsilon_analytic and the number of
      words kept (a DP output); the private number of distinct words is not recorded.

    Raises:
      ValueError: no word survived the threshold.
    """
    if seed is None:
        seed = secrets.randbits(63)
    histogram = word_histogram(
        examples,
        max_words=params.max_words,
        max_count_per_word=params.max_count_per_word,
        split_words=split_words,
    )
    survivors = noisy_threshold(
        histogram, noise_stddev=params.noise_stddev, threshold=params.threshold, seed=seed
    )
    if not survivors:
        raise ValueError(
            f"No word's noisy count exceeded the threshold C={params.threshold:.2f}; use more "
            "data, a smaller noise_stddev, a larger delta, or a public-text tokenizer."
        )
    survivors, num_kept = with_public_words(survivors, public_words), len(survivors)
    # SentencePiece needs a piece per character (coverage 1.0; ▁, the word boundary, too)
    # besides the special and byte pieces: fail in one line (the survivors are the DP output).
    characters = len(set("▁").union(*survivors)) if character_coverage >= 1.0 else 0
    if characters + _SPECIAL_AND_BYTE_PIECES * byte_fallback + sentinels > vocab_size:
        raise ConfigError(
            f"tokenizer.vocab_size={vocab_size} is too small for the DP vocabulary: the words "
            f"that passed its threshold hold {characters} distinct characters, and SentencePiece "
            f"needs a piece for each besides {_SPECIAL_AND_BYTE_PIECES} special and byte pieces "
            f"and {sentinels} sentinels. "
            "Raise tokenizer.vocab_size (e.g. 1000), or use a public vocabulary."
        )
    with tempfile.TemporaryDirectory() as folder:
        tsv_path = os.path.join(folder, "noisy_histogram.tsv")
        with open(tsv_path, "w", encoding="utf-8") as f:
            for word, count in survivors.items():
                f.write(f"{word}\t{max(1, round(count))}\n")
        model_path = os.path.join(folder, "dp_spm")
        train_model(
            input=tsv_path,
            input_format="tsv",
            model_prefix=model_path,
            **sentencepiece_trainer_args(
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                byte_fallback=byte_fallback,
                seed=seed % 2**31,
                sentinels=sentinels,
            ),
        )
        tokenizer = SentencePieceTokenizer.load(model_path + ".model")
    record = VocabularyRecord(
        kind="dp_sentencepiece",
        covered_by_guarantee=True,
        # The classical formula is only proven for eps < 1 and understates eps
        # above ~10; the exact Gaussian eps is valid everywhere. Record the larger.
        epsilon=max(params.epsilon, params.epsilon_analytic),
        delta=params.delta,
        note=(
            f"DP-SentencePiece vocabulary: (eps={max(params.epsilon, params.epsilon_analytic):.4g}"
            f", delta={params.delta:.3g}), the larger of the classical Gaussian bound "
            f"({params.epsilon:.4g}) and the exact Gaussian eps ({params.epsilon_analytic:.4g}). "
            "Compose with DP-SGD's guarantee by basic composition (eps and delta add)."
        ),
        details={
            "noise_stddev": params.noise_stddev,
            "max_words": params.max_words,
            "max_count_per_word": params.max_count_per_word,
            "l2_sensitivity": params.l2_sensitivity,
            "threshold": params.threshold,
            "epsilon_classical_formula": params.epsilon,
            "epsilon_analytic": params.epsilon_analytic,
            "num_words_kept": num_kept,
            "public_words": sorted(set(public_words)),
            "vocab_size": tokenizer.vocab_size,
            "model_type": model_type,
            # No seed here: whoever knows it can regenerate and subtract the noise.
        },
    )
    return tokenizer, record
