"""translate() = generate() per single unpadded sentence, in order, for any batch split."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpnmt.data import tokenizers
from dpnmt.evaluation import encode_sources, translate
from dpnmt.models import T5Config, create_model, decoding, init_params

MAX_SOURCE_LENGTH = 16
BATCH_SIZE = 2

_GENERATED = [
    "the quick brown fox jumps over the lazy dog",
    "a small model translates short sentences",
    "we measure privacy with epsilon and delta",
    "noise is added once per lot of examples",
    "the weather was cold and the river froze",
]


def _training_lines() -> list[str]:
    """A few hundred lines of the shared WMT sample, else generated text."""
    root = os.environ.get("DPNMT_DATA_DIR")
    if root:
        lines = []
        for name in ("train.de", "train.en"):
            with open(os.path.join(root, "wmt_sample_de_en", name), encoding="utf-8") as f:
                lines += [next(f).strip() for _ in range(200)]
        return lines
    rng = np.random.default_rng(0)
    words = " ".join(_GENERATED).split()
    return [" ".join(rng.choice(words, size=rng.integers(3, 15))) for _ in range(400)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("spm") / "text.txt"
    lines = _training_lines()
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tokenizer, _ = tokenizers.train_sentencepiece([str(path)], vocab_size=600, seed=0)
    config = T5Config(
        vocab_size=tokenizer.vocab_size,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=4,
        dropout_rate=0.0,
        pad_token_id=tokenizer.pad_id,
        eos_token_id=tokenizer.eos_id,
        decoder_start_token_id=tokenizer.pad_id,
    )
    model = create_model(config)
    # Doubled random weights: sharper logits, so outputs vary with the input.
    params = jax.tree.map(lambda w: 2.0 * w, init_params(model, jax.random.key(0)))
    # 5 sources (not a multiple of BATCH_SIZE): 4 short ones of different lengths
    # (padded in a batch) and a long one (truncated).
    short = [" ".join(line.split()[:n]) for n, line in zip((1, 2, 4, 6), lines[1:5], strict=True)]
    sources = short + [" ".join(lines[5:8])]
    return tokenizer, config, model, params, sources


def _one_by_one(model, params, tokenizer, sources, gen):
    """Reference: generate() on each sentence alone, unpadded ([1, its length])."""
    outputs = []
    for ids in tokenizer.encode(sources, max_length=MAX_SOURCE_LENGTH):
        input_ids = jnp.asarray([ids], jnp.int32)
        tokens, _ = decoding.generate(model, params, input_ids, jnp.ones_like(input_ids), gen)
        outputs += tokenizer.decode(np.asarray(tokens).tolist())
    return outputs


@pytest.mark.parametrize("num_beams", [1, 2])
def test_matches_generate_per_sentence(setup, num_beams):
    tokenizer, config, model, params, sources = setup
    assert len(sources) % BATCH_SIZE != 0
    lengths = [len(ids) for ids in tokenizer.encode(sources)]
    assert max(lengths) > MAX_SOURCE_LENGTH
    kept = [min(n, MAX_SOURCE_LENGTH) for n in lengths]
    assert len(set(kept)) >= 3 and min(kept) < MAX_SOURCE_LENGTH  # padding is exercised
    gen = decoding.from_model_config(config, max_new_tokens=6, num_beams=num_beams)
    expected = _one_by_one(model, params, tokenizer, sources, gen)
    assert len(set(expected)) > 2  # the random model's outputs depend on the input

    outputs = translate(
        model,
        params,
        tokenizer,
        sources,
        gen=gen,
        batch_size=BATCH_SIZE,
        max_source_length=MAX_SOURCE_LENGTH,
    )
    assert outputs == expected

    # Any order of the inputs gives the same translation per sentence, in input order.
    permutation = np.random.default_rng(1).permutation(len(sources))
    shuffled = translate(
        model,
        params,
        tokenizer,
        [sources[i] for i in permutation],
        gen=gen,
        batch_size=BATCH_SIZE,
        max_source_length=MAX_SOURCE_LENGTH,
        show_progress=False,
    )
    assert shuffled == [expected[i] for i in permutation]


def test_id_sources_and_prefix(setup):
    tokenizer, config, model, params, sources = setup
    gen = decoding.from_model_config(config, max_new_tokens=6)
    kwargs = dict(gen=gen, batch_size=BATCH_SIZE, max_source_length=MAX_SOURCE_LENGTH)
    ids = tokenizer.encode(sources, max_length=MAX_SOURCE_LENGTH)
    from_text = translate(model, params, tokenizer, sources, **kwargs)
    from_ids = translate(model, params, tokenizer, ids, **kwargs)
    assert from_ids == from_text and len(from_ids) == len(sources)

    prefixed, truncated = encode_sources(
        tokenizer, sources, max_source_length=MAX_SOURCE_LENGTH, source_prefix="translate: "
    )
    assert prefixed == tokenizer.encode(
        ["translate: " + s for s in sources], max_length=MAX_SOURCE_LENGTH
    )
    assert truncated == sum(
        len(x) > MAX_SOURCE_LENGTH for x in tokenizer.encode(["translate: " + s for s in sources])
    )
    assert truncated >= 1
    assert translate(model, params, tokenizer, [], **kwargs) == []


def test_bad_sources(setup):
    tokenizer, config, model, params, _ = setup
    gen = decoding.from_model_config(config, max_new_tokens=2)
    kwargs = dict(gen=gen, batch_size=2, max_source_length=4)
    with pytest.raises(ValueError, match="mixes strings and token-id lists"):
        translate(model, params, tokenizer, ["a", [5, 1]], **kwargs)
    with pytest.raises(ValueError, match="source_prefix applies to text"):
        translate(model, params, tokenizer, [[5, 1]], source_prefix="x", **kwargs)
    with pytest.raises(ValueError, match=r"sources\[1\] has 5 token ids"):
        translate(model, params, tokenizer, [[5, 1], [5, 6, 7, 8, 1]], **kwargs)
    with pytest.raises(ValueError, match=r"sources\[0\] has 0 token ids"):
        translate(model, params, tokenizer, [[]], **kwargs)
    with pytest.raises(ValueError, match="batch_size=0"):
        translate(model, params, tokenizer, ["a"], **{**kwargs, "batch_size": 0})


@pytest.mark.parametrize("terminal", [False, True])
def test_the_progress_bar_shows_on_a_terminal_only(setup, capsys, monkeypatch, terminal):
    """A log file (stderr redirected) got tqdm's carriage-return bars."""
    tokenizer, config, model, params, sources = setup
    monkeypatch.setattr("sys.stderr.isatty", lambda: terminal, raising=False)
    gen = decoding.from_model_config(config, max_new_tokens=2)
    kwargs = dict(gen=gen, batch_size=BATCH_SIZE, max_source_length=MAX_SOURCE_LENGTH)
    translate(model, params, tokenizer, sources, show_progress=True, **kwargs)
    assert ("translate:" in capsys.readouterr().err) == terminal
