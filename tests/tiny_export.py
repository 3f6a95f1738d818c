"""A tiny T5 with a public SentencePiece, written as a transformers folder (no hub).

The tests' stand-in for a pretrained model (`model.name_or_path`): a 16-wide,
1+1-layer T5 and a 320-piece (or `vocab_size`) vocabulary learnt on 200 lines
of `sentence` (public, made up), without dpnmt.json and without T5 sentinels.
"""

import pathlib

import jax

from dpnmt import config_lib
from dpnmt.config import RunConfig


def write_tiny_export(
    folder: pathlib.Path,
    sentence: str = "ein kleiner Satz {i} hier, a small sentence",
    *,
    vocab_size: int = 320,
    feed_forward_proj: str | None = None,
) -> pathlib.Path:
    """Writes the model and tokenizer into `folder` and returns it.

    Args:
      folder: an existing, empty folder.
      sentence: a line with `{i}`, formatted for i < 200: the vocabulary's text.
      vocab_size: SentencePiece pieces.
      feed_forward_proj: e.g. "relu" (T5 v1.0, tied embeddings); None: the default.
    """
    from dpnmt.data import hf_tokenizer, tokenizers
    from dpnmt.models import export
    from dpnmt.training import pieces

    text = folder / "public.txt"
    text.write_text("".join(sentence.format(i=i) + "\n" for i in range(200)))
    tokenizer, _ = tokenizers.train_sentencepiece([str(text)], vocab_size=vocab_size)
    text.unlink()
    config = config_lib.make_config("nonprivate")
    config.model.update(d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1)
    config.model.num_heads = 2
    if feed_forward_proj is not None:
        config.model.feed_forward_proj = feed_forward_proj
    _, model_config, params = pieces.build_model(
        RunConfig.of(config).model, tokenizer, jax.random.key(0)
    )
    export.save_pretrained(params, model_config, str(folder))
    hf_tokenizer.save_tokenizer(tokenizer, str(folder))
    return folder
