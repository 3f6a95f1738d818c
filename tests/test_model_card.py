"""The model card says which parameters DP-SGD trained (pure rendering, no run)."""

import pytest

from dpnmt import model_card
from dpnmt.config import RunConfig

PRIVACY = {"private": True, "total_epsilon": 8.0, "total_delta": 1e-8, "bound": "Poisson"}


def _card(**model):
    config = {"data": {"pair": "de-en"}, "model": {"name_or_path": "base", **model}}
    return model_card.render(RunConfig.of(config), PRIVACY, None, steps_done=3)


@pytest.mark.parametrize(
    ("model", "expected", "absent"),
    [
        ({"finetune": "all"}, "trained parameters: all parameters", "LoRA"),
        ({}, "trained parameters: all parameters", "LoRA"),
        (
            {"finetune": "lora", "lora_rank": 8, "lora_alpha": 16.0, "lora_targets": "q,v"},
            "LoRA adapters (rank 8, alpha 16.0, on q,v), merged",
            "all parameters",
        ),
        (
            {"finetune": "lora", "lora_rank": 4, "lora_alpha": None, "lora_targets": "q"},
            "LoRA adapters (rank 4, alpha 4, on q), merged",
            "all parameters",
        ),
        ({"finetune": "bias"}, "trained parameters: bias terms only", "LoRA"),
        (
            {"finetune": "all", "trainable": "decoder/.*"},
            "parameters whose path matches `decoder/.*`; the others frozen",
            "all parameters",
        ),
        (
            {"finetune": "all", "lora_rank": 2, "lora_targets": "q"},
            "trained parameters: all parameters, and LoRA adapters (rank 2, alpha 2, on q)",
            "adapters only",
        ),
    ],
)
def test_card_names_the_trained_parameters(model, expected, absent):
    card = _card(**model)
    assert expected in card
    assert absent not in card
    if model.get("lora_rank"):
        assert "merged into the exported weights" in card


def test_card_names_corpus_and_base_model_without_paths_and_resolves_the_vocabulary(tmp_path):
    """The card printed `corpus: files:/home/.../mydata` and a local base model's absolute
    folder (published local paths), and `vocabulary: auto` instead of the kind used."""
    corpus, base = tmp_path / "mydata", tmp_path / "models" / "mt5-small"
    config = {
        "data": {"pair": "de-en", "corpus": f"files:{corpus}"},
        "model": {"name_or_path": str(base)},
        "tokenizer": {"kind": "auto"},
    }
    card = model_card.render(RunConfig.of(config), PRIVACY, None, steps_done=3)
    assert str(tmp_path) not in card
    assert "- corpus: files:mydata, direction de-en" in card
    assert "Base model: mt5-small." in card
    assert "- vocabulary: pretrained" in card
    scratch = {**config, "model": {"name_or_path": None}}
    card = model_card.render(RunConfig.of(scratch), PRIVACY, None, steps_done=3)
    assert "- vocabulary: dp_sentencepiece" in card
    reported = {**PRIVACY, "vocabulary": {"kind": "sentencepiece_public"}}
    card = model_card.render(RunConfig.of({**config, "model": {}}), reported, None, steps_done=3)
    assert "- vocabulary: sentencepiece_public" in card
    hub = {**config, "data": {"pair": "de-en", "corpus": "wmt16"}}
    hub["model"] = {"name_or_path": "google/mt5-small"}
    card = model_card.render(RunConfig.of(hub), PRIVACY, None, steps_done=3)
    assert "- corpus: wmt16," in card and "Base model: google/mt5-small." in card


@pytest.mark.parametrize(
    ("corpus", "expected"),
    [
        ("detok:files:/home/me/x", "detok:files:x"),
        ("files:/a,files:/b", "files:a,files:b"),
        ("files:/data/tatoeba_de_en, detok:wmt16", "files:tatoeba_de_en,detok:wmt16"),
        ("hub:org/set,detok:hub:./local/set", "hub:org/set,detok:hub:set"),
        ("detok:nosuch:/home/me/y,files:~/z", "detok:nosuch:y,files:z"),  # Unknown: named too.
    ],
)
def test_card_names_each_corpus_of_a_list_and_detok_corpora_without_paths(corpus, expected):
    """`public_corpus` split "kind:arg" once: `detok:files:/home/me/x` kept its absolute
    path, and `files:/a,files:/b` became `files:b` (one corpus vanished from the card)."""
    config = {"data": {"pair": "de-en", "corpus": corpus}, "model": {}}
    card = model_card.render(RunConfig.of(config), PRIVACY, None, steps_done=3)
    assert f"- corpus: {expected}, direction de-en" in card
    assert "/home/me" not in card and "~" not in card


def _report(unit: str) -> dict:
    from dpnmt import config_lib, privacy
    from dpnmt.data.tokenizers import VocabularyRecord
    from dpnmt.training.privacy_report import privacy_report

    config = config_lib.base_config()
    config.dp.update(unit=unit, group_cap=8, delta=1e-5, noise_multiplier=1.2)
    config.train.expected_lot_size, config.train.num_epochs = 6, 1
    plan = privacy.plan_privacy(config.dp, config.train, dataset_size=968, num_groups=42)
    vocabulary = VocabularyRecord("sentencepiece_public", False, epsilon=0.0)
    return privacy_report(plan, plan.num_steps, vocabulary).to_json()


def test_card_of_a_group_unit_run_states_the_group_guarantee_and_counts_groups():
    run = RunConfig.of({"data": {"pair": "de-en"}, "model": {"name_or_path": "base"}})
    card = model_card.render(run, _report("group"), None, steps_done=3)
    assert "adding or removing one whole group" in card
    assert "per-group clipping, each group capped at k = 8" in card
    assert "| groups N_groups (`dataset_size`) | 42 |" in card
    assert "sentence pair, for" not in card and "per-example clipping" not in card
    assert "training pairs N" not in card and "training-set size N" not in card
    # An example-unit run keeps the per-pair statement.
    card = model_card.render(run, _report("example"), None, steps_done=3)
    assert "adding or removing one training sentence pair" in card
    assert "| training pairs N (`dataset_size`) | 968 |" in card


def test_card_shows_greek_letters_not_json_escapes():
    privacy = {**PRIVACY, "composition": {"rule": "σ and ε composed", "parts": ["δ"]}}
    card = model_card.render(RunConfig.of({"data": {"pair": "de-en"}}), privacy, None, steps_done=3)
    assert "\\u03c3" not in card and "\\u03b5" not in card and "\\u03b4" not in card
    assert "σ and ε composed" in card
