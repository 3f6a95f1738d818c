"""A run's tokenizer -> a folder that `transformers.AutoTokenizer.from_pretrained` loads.

A dpnmt SentencePiece model (DP-SentencePiece, public or private) has the T5
id layout: pad=0, eos=1, unk=2, no bos, eos appended to every sequence, no id
offset and no `<extra_id_*>` tokens. It is written twice:

  * `spiece.model`: the SentencePiece model itself, unchanged (what
    `T5Tokenizer` and `sentencepiece` read);
  * `tokenizer.json` + `tokenizer_config.json`: transformers' own converter
    (`convert_slow_tokenizer.SpmConverter`, unigram or BPE) with byte fallback
    kept and "$A </s>" as post-processor, so `AutoTokenizer` gives the same ids
    as dpnmt (T5Tokenizer built from spiece.model alone would drop byte
    fallback and add 100 extra ids).

One difference remains: the literal text "<pad>", "</s>" or "<unk>" in an input
is one special id for transformers, but plain characters for SentencePiece.

A pretrained model's own transformers tokenizer is saved as it is.
"""

from __future__ import annotations

import importlib
import os
import types

from dpnmt.data.tokenizers import EOS_ID, HFTokenizer, SentencePieceTokenizer, Tokenizer

SPIECE_FILE = "spiece.model"


def _converter_class():
    """The SentencePiece converter of transformers, with byte fallback and T5's eos."""
    from tokenizers import decoders, processors
    from tokenizers.models import BPE

    # `from transformers import convert_slow_tokenizer` gives the function, not the module.
    convert = importlib.import_module("transformers.convert_slow_tokenizer")

    class _Extractor(convert.SentencePieceExtractor):
        def extract(self, vocab_scores):  # The converter's BPE call passes scores only.
            del vocab_scores
            found = super().extract(BPE)
            return found["vocab"], found["merges"]

    class _Converter(convert.SpmConverter):
        handle_byte_fallback = True
        SpmExtractor = _Extractor

        def post_processor(self):
            return processors.TemplateProcessing(
                single=["$A", "</s>"],
                pair=["$A", "</s>", "$B", "</s>"],
                special_tokens=[("</s>", EOS_ID)],
            )

        def decoder(self, replacement, add_prefix_space):
            return decoders.Sequence(
                [
                    decoders.ByteFallback(),
                    decoders.Metaspace(replacement=replacement, prepend_scheme="always"),
                ]
            )

    return _Converter


def save_sentencepiece(tokenizer: SentencePieceTokenizer, out_dir: str) -> None:
    """Writes `spiece.model`, `tokenizer.json` and `tokenizer_config.json` to `out_dir`."""
    import transformers

    pieces = tokenizer.pieces()
    if (pieces[tokenizer.pad_id], pieces[tokenizer.eos_id]) != ("<pad>", "</s>"):
        raise ValueError(
            f"SentencePiece pad/eos pieces are {pieces[tokenizer.pad_id]!r}/"
            f"{pieces[tokenizer.eos_id]!r}; export expects dpnmt's <pad>/</s>."
        )
    os.makedirs(out_dir, exist_ok=True)
    spiece = os.path.join(out_dir, SPIECE_FILE)
    tokenizer.save(spiece)
    original = types.SimpleNamespace(vocab_file=spiece, add_prefix_space=True)
    backend = _converter_class()(original).converted()
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    ).save_pretrained(out_dir)


def save_tokenizer(tokenizer: Tokenizer, out_dir: str) -> None:
    """Saves a run's tokenizer (SentencePiece or a pretrained model's) to `out_dir`."""
    if isinstance(tokenizer, SentencePieceTokenizer):
        save_sentencepiece(tokenizer, out_dir)
    elif isinstance(tokenizer, HFTokenizer):
        tokenizer.tokenizer.save_pretrained(out_dir)
    else:
        raise TypeError(f"Cannot export a {type(tokenizer).__name__} tokenizer.")
