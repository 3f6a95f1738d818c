"""T5 sentinels added to a pretrained tokenizer that lacks them (`tokenizer.sentinels = K`).

Span corruption needs T5's `<extra_id_i>` pieces. A dpnmt SentencePiece
vocabulary reserves them when it is built; a pretrained model's tokenizer (a
dpnmt export of a vocabulary built without them) cannot be rebuilt without
renumbering its pieces, so the run APPENDS them: K special tokens after the V
existing ids, in T5's order (`<extra_id_0>` the highest id, V + K - 1, as in
Hugging Face's T5 tokenizers), and the model grows K embedding rows
(`dpnmt.models.vocabulary.grow_vocabulary`). Which pieces, their ids and the
new rows depend on K and the public model alone: no privacy cost, and every
rebuild (resume, decode, export) gives the same tokenizer. A tokenizer that
already has a sentinel (T5, mT5, an export of such a run) is left unchanged.
"""

from __future__ import annotations

from dpnmt.data.objectives import sentinel_pieces
from dpnmt.data.tokenizers import HFTokenizer


class SentinelTokenizer(HFTokenizer):
    """A pretrained tokenizer with `added_sentinels` T5 sentinels appended by this run."""

    added_sentinels: int = 0


def has_sentinels(tokenizer: HFTokenizer) -> bool:
    """Whether the tokenizer has T5's first sentinel `<extra_id_0>`."""
    return tokenizer.piece_id(sentinel_pieces(1)[0]) is not None


def with_sentinels(tokenizer: HFTokenizer, count: int) -> HFTokenizer:
    """`tokenizer` with `count` sentinels appended, unless it has some already (or count is 0).

    Args:
      tokenizer: a pretrained model's tokenizer (`tokenizers.load_pretrained_tokenizer`);
        its transformers tokenizer is changed in place.
      count: K, sentinels to append.

    Returns:
      A `SentinelTokenizer` (ids V .. V+K-1 are `<extra_id_{K-1}>` .. `<extra_id_0>`),
      or `tokenizer` itself when there is nothing to add.

    Raises:
      ValueError: the transformers tokenizer did not number them V .. V+K-1.
    """
    if count == 0 or has_sentinels(tokenizer):
        return tokenizer
    inner = tokenizer.tokenizer
    size = len(inner)
    pieces = sentinel_pieces(count)[::-1]  # <extra_id_0> last: the highest id.
    inner.add_tokens(pieces, special_tokens=True)  # Never split, skipped when decoding.
    ids = [inner.convert_tokens_to_ids(piece) for piece in pieces]
    if ids != list(range(size, size + count)):
        raise ValueError(
            f"adding {count} sentinels to a tokenizer of {size} ids gave ids {ids[:3]}..., "
            f"not {size}..{size + count - 1}; this tokenizer cannot take appended sentinels."
        )
    grown = SentinelTokenizer(inner, src_lang=tokenizer.src_lang, tgt_lang=tokenizer.tgt_lang)
    grown.added_sentinels = count
    return grown


def added_sentinels(tokenizer) -> int:
    """How many sentinels this run appended to its tokenizer (0: none)."""
    return getattr(tokenizer, "added_sentinels", 0)
