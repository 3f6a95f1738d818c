"""Span corruption from a pretrained model whose tokenizer lacks T5's sentinels.

`tokenizer.sentinels = K` appends K `<extra_id_i>` pieces to the pretrained
tokenizer (`<extra_id_0>` the highest id) and K public rows to the model's
embedding (`models.vocabulary`); the run trains, exports and the export loads
in transformers with the grown vocabulary. A model with sentinels is untouched.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from dpnmt import models, release
from dpnmt.config import RunConfig
from dpnmt.data import objectives, sentinels, tokenizers
from dpnmt.errors import ConfigError
from dpnmt.evaluation import decode as decode_lib
from dpnmt.models import vocabulary
from dpnmt.training import loop, pieces, preflight, setup
from tests.models import hf_models
from tests.small_configs import smaller_config
from tests.tiny_export import write_tiny_export

TEXTS = [f"Der Satz {i} ist {i % 7} Worte lang ." for i in range(64)]
OTHER = [f"Ein anderer Text {i} mit {i % 5} Teilen ." for i in range(64)]
K = 8


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    return write_model_without_sentinels(tmp_path_factory.mktemp("public_model"))


def write_model_without_sentinels(folder):
    """A tiny tied T5 v1.0 and a public SentencePiece WITHOUT sentinels, as dpnmt exports them."""
    write_tiny_export(
        folder, "Ein Satz {i} ist kurz, a small sentence", vocab_size=300, feed_forward_proj="relu"
    )
    assert json.loads((folder / "config.json").read_text())["tie_word_embeddings"]  # v1.0: tied.
    return folder


def _mono(folder, texts):
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", texts), ("validation", texts[:4]), ("test", texts[:4])):
        (folder / f"{split}.de").write_text("".join(t + "\n" for t in rows), encoding="utf-8")
    return folder


def _config(tmp_path, model_folder, texts=TEXTS, sentinels_=K):
    c = smaller_config("eps8")
    c.data.corpus = f"files:{_mono(tmp_path / 'mono', texts)}"
    c.data.pair, c.data.objective, c.data.objective_language = "de-en", "span_corruption", "de"
    c.data.max_train_examples = None
    c.data.max_source_length = c.data.max_target_length = 24  # Up to 4 spans.
    c.model.name_or_path, c.model.family = str(model_folder), "none"
    c.tokenizer.kind, c.tokenizer.sentinels = "pretrained", sentinels_
    c.train.expected_lot_size = 16
    c.train.checkpoint_every_steps = c.train.log_every_steps = 2
    return c


def _tokenizer_and_model(c):
    run = RunConfig.of(c)
    tokenizer, record = pieces.build_tokenizer(run, None, "unused", noise_seed=None, learn=False)
    _, model_config, params = pieces.build_model(run.model, tokenizer, jax.random.key(1))
    return tokenizer, record, model_config, params


def test_without_sentinels_span_corruption_is_refused_before_anything_is_written(
    model_folder, tmp_path
):
    c = _config(tmp_path, model_folder)
    c.data.max_source_length = 64
    needed = objectives.span_count(63, noise_density=0.15, mean_span_length=3.0)
    assert needed == 3
    for k in (0, needed - 1):  # None asked for, or fewer than the longest text's spans.
        c.tokenizer.sentinels = k
        with pytest.raises(ConfigError, match=r"tokenizer.sentinels >= 3 \(<extra_id_i> pieces ap"):
            preflight.check_static(RunConfig.of(c), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
    c.tokenizer.sentinels = needed
    preflight.check_static(RunConfig.of(c), str(tmp_path / "run"))


def test_sentinels_are_appended_in_t5_order_and_the_rows_are_public(model_folder, tmp_path):
    plain, _ = tokenizers.load_pretrained_tokenizer(str(model_folder))
    _, old_params, _ = models.load_pretrained(str(model_folder))
    old = np.asarray(old_params["shared"]["embedding"])
    v = plain.vocab_size
    assert old.shape[0] == v and not sentinels.has_sentinels(plain)
    built = setup.build_run(RunConfig.of(_config(tmp_path, model_folder)), str(tmp_path / "a"))
    tokenizer, record = built.data.tokenizer, built.privacy.vocabulary
    model_config, params = built.model.model_config, built.model.trainable
    # <extra_id_0> the highest id, as in Hugging Face's T5 tokenizers.
    assert tokenizer.vocab_size == v + K == model_config.vocab_size
    assert [tokenizer.piece_id(f"<extra_id_{i}>") for i in range(K)] == list(
        range(v + K - 1, v - 1, -1)
    )
    assert tokenizer.encode([TEXTS[0]]) == plain.encode([TEXTS[0]])  # Text ids unchanged.
    # Added tokens: a literal "<extra_id_0>" in a text is the sentinel (docs/data.md).
    assert v + K - 1 in tokenizer.encode(["a <extra_id_0> b"])[0]
    assert v + K - 1 not in plain.encode(["a <extra_id_0> b"])[0]
    assert record.details["sentinels_added"] == K and "appended" in record.note
    grown = np.asarray(params["shared"]["embedding"])
    assert grown.shape == (v + K, old.shape[1]) and "lm_head" not in params  # Still tied.
    np.testing.assert_array_equal(grown[:v], old)  # Old rows exactly.
    new = grown[v:]
    # Independent of the training data: another corpus gives the same rows, and they are
    # the documented function of the public embedding (mean + 1e-9 Σ spread, fixed seed).
    other = setup.build_run(
        RunConfig.of(_config(tmp_path / "b", model_folder, OTHER)), str(tmp_path / "b" / "run")
    )
    np.testing.assert_array_equal(np.asarray(other.model.trainable["shared"]["embedding"]), grown)
    np.testing.assert_array_equal(new, vocabulary.new_rows(old, K))
    np.testing.assert_allclose(new, np.broadcast_to(old.mean(0), new.shape), atol=1e-3)
    assert len({row.tobytes() for row in new}) == K  # Distinct sentinels.


def test_an_untied_head_grows_too_and_a_model_with_sentinels_is_untouched(tmp_path):
    config, _, params = hf_models.convert_model(hf_models.hf_model("t5_v11"))
    assert not config.tie_word_embeddings
    grown, grown_config = vocabulary.grow_vocabulary(params, config, 3, total=config.vocab_size + 3)
    v, d = np.asarray(params["shared"]["embedding"]).shape
    assert grown_config.vocab_size == v + 3 and grown["lm_head"]["kernel"].shape == (d, v + 3)
    np.testing.assert_array_equal(grown["lm_head"]["kernel"][:, :v], params["lm_head"]["kernel"])
    # The new columns are the documented rows of the head's own [V, d] table (not the
    # embedding's), and the new embedding rows those of the embedding.
    head = np.asarray(params["lm_head"]["kernel"]).T
    np.testing.assert_array_equal(
        np.asarray(grown["lm_head"]["kernel"])[:, v:], vocabulary.new_rows(head, 3).T
    )
    np.testing.assert_array_equal(
        np.asarray(grown["shared"]["embedding"])[v:],
        vocabulary.new_rows(np.asarray(params["shared"]["embedding"]), 3),
    )
    with pytest.raises(ValueError, match="would not be the new rows"):
        vocabulary.grow_vocabulary(params, config, 3, total=config.vocab_size + 5)
    # A tokenizer with sentinels (here: the export of an appended one) is left as it is.
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=_word_level(["<pad>", "</s>", "<unk>", "a", "<extra_id_0>"]),
        pad_token="<pad>",
        eos_token="</s>",
    )
    tokenizer = tokenizers.HFTokenizer(hf)
    assert sentinels.with_sentinels(tokenizer, 16) is tokenizer
    assert sentinels.added_sentinels(tokenizer) == 0
    same, same_config = vocabulary.grow_vocabulary(params, config, 0)
    assert same is params and same_config is config


def _word_level(words):
    from tokenizers import Tokenizer, models  # noqa: PLC0415

    return Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))


@pytest.mark.slow
def test_span_corruption_trains_from_it_resumes_exactly_and_exports_to_transformers(
    model_folder, tmp_path
):
    c = _config(tmp_path, model_folder)
    whole, split = tmp_path / "whole", tmp_path / "split"
    results = loop.train_and_evaluate(RunConfig.of(c), str(whole))
    assert results["finished"] and results["steps_done"] >= 4
    partial = loop.train_and_evaluate(RunConfig.of(c), str(split), stop_after_steps=2)
    assert not partial["finished"]
    loop.train_and_evaluate(RunConfig.of(c), str(split))
    a, b = (decode_lib.load_trained_params(str(w))[0] for w in (whole, split))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # Bit for bit.
    out = tmp_path / "exported"
    release.export_run(str(whole), str(out))
    hf = transformers.T5ForConditionalGeneration.from_pretrained(str(out)).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    v = len(tok) - K
    assert hf.config.vocab_size == len(tok) == v + K
    assert tok.convert_tokens_to_ids("<extra_id_0>") == v + K - 1
    run = decode_lib.load_run_config(str(whole))
    _, model, model_config, params, _, _ = decode_lib.load_trained(run, str(whole))
    assert model_config.vocab_size == v + K
    ids, mask, dec, dec_mask = hf_models.padded_batch(seed=3, batch=3, src_len=10, tgt_len=5)
    ids[0, :2] = [v + K - 1, v]  # Sentinels in the input too.
    expected = hf_models.hf_logits(hf, ids, mask, dec, dec_mask)
    logits = model.apply({"params": params}, *map(jnp.asarray, (ids, mask, dec, dec_mask)))
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-4, rtol=0)
    # The export has its sentinels: span corruption from it appends none and grows nothing.
    tokenizer, _, config, _ = _tokenizer_and_model(_config(tmp_path / "c", out))
    assert sentinels.added_sentinels(tokenizer) == 0 and config.vocab_size == v + K


@pytest.mark.parametrize(
    "change, why",
    [
        ({"data.objective": "translation"}, "uses no sentinels (only span_corruption"),
        ({"data.objective": "prefix_lm"}, "uses no sentinels (only span_corruption"),
        ({"model_type": "bart"}, "sentinel rows are appended to T5 and mT5 models only"),
        ({"vocab_size": 320}, "its model has 320 embedding rows and its tokenizer 300 ids"),
        ({"model.finetune": "lora"}, "model.finetune='lora' freezes shared/embedding"),
        ({"model.trainable": "encoder/"}, "model.trainable='encoder/' freezes shared/embedding"),
        ({"model.trainable": "shared/", "untied": True}, "freezes lm_head/kernel"),
    ],
)
def test_appended_sentinels_that_cannot_work_are_refused_before_anything_is_written(
    model_folder, tmp_path, change, why
):
    """They failed in build_model, after config.json and private/ were written (a non-T5
    model, or vocab_size != the tokenizer's size), or trained silently: sentinels grown for
    the translation objective, or new rows frozen near-identical (LoRA, a trainable regex)."""
    import json  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    folder = tmp_path / "model"
    shutil.copytree(model_folder, folder)
    hf_config = json.loads((folder / "config.json").read_text())
    hf_config["tie_word_embeddings"] = not change.get("untied")  # Only config.json is read.
    for key in ("model_type", "vocab_size"):
        if key in change:
            hf_config[key] = change[key]
    (folder / "config.json").write_text(json.dumps(hf_config))
    c = _config(tmp_path, folder)
    for key, value in change.items():
        if "." in key:
            section, field = key.split(".")
            setattr(getattr(c, section), field, value)
    if c.model.finetune == "lora":
        c.model.lora_rank = 4
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError) as error:
        loop.train_and_evaluate(RunConfig.of(c), str(workdir))
    assert why in str(error.value) and "tokenizer.sentinels=8 appends" in str(error.value)
    assert not workdir.exists()


def test_trained_appended_sentinels_pass_the_check(model_folder, tmp_path):
    from dpnmt.data import checks  # noqa: PLC0415

    c = _config(tmp_path, model_folder)
    assert checks.appended_sentinel_problems(RunConfig.of(c)) == []
    c.model.trainable = "shared/|decoder/"  # Tied: the embedding is the head.
    assert checks.appended_sentinel_problems(RunConfig.of(c)) == []
    c.tokenizer.sentinels = 0  # Nothing appended: nothing to check here.
    c.data.objective = "translation"
    assert checks.appended_sentinel_problems(RunConfig.of(c)) == []
