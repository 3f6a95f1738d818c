"""Every from-scratch config starts at a per-token loss near log(vocabulary size).

A freshly initialised model should know nothing: its logits are small and
nearly uniform, so the cross-entropy is about log V. With logits z ~ N(0, s²)
over V classes, E[logsumexp z] ≈ log V + s²/2 and E[z_label] = 0, so the
initial loss is log V + s²/2. The test allows ±1.5 nats: logits up to
s = √3 pass (a sane init has s ≈ 1: T5 v1.0's tied head scaled by
d_model^-0.5, or an untied head with std d_model^-0.5, gives +0.5); an
untied head drawn with std 1 on unit-RMS states (s = √d_model, +d_model/2
nats) fails by tens of nats. Below log V - 1.5 would mean the untrained model
already predicts the data, which random weights cannot.
"""

import json
import math
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpnmt import config_lib, models
from dpnmt.config import RunConfig
from dpnmt.data import tokenizers
from dpnmt.training import pieces
from tests.markers import needs_data
from tests.small_configs import load_config

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
MARGIN_NATS = 1.5
NUM_PAIRS = 64


def _load_config(path: pathlib.Path):
    return load_config(path)


def _from_scratch_configs():
    """(name, config) of the configs/ files that build a model from scratch, and the base."""
    found = [("config_lib.base_config", config_lib.base_config())]
    for path in sorted(CONFIGS.glob("*.py")):
        config = _load_config(path)
        if config.model.name_or_path is None:
            found.append((path.name, config))
    return found


FROM_SCRATCH = _from_scratch_configs()


def _same_start(config) -> str:
    """What the initial loss depends on: the model, V, the lengths and the seed."""
    fields = [config.model.to_dict(), config.tokenizer.vocab_size, config.data.max_source_length]
    fields += [config.data.max_target_length, config.seed]
    return json.dumps(fields, sort_keys=True, default=str)


def _distinct_starts():
    """One (names, config) per distinct start: configs that agree on all of it build the
    same model on the same pieces, so one loss stands for them all (CI time)."""
    groups: dict[str, tuple[list[str], object]] = {}
    for name, config in FROM_SCRATCH:
        groups.setdefault(_same_start(config), ([], config))[0].append(name)
    return [("+".join(names), config) for names, config in groups.values()]


DISTINCT = _distinct_starts()


def test_configs_folder_has_from_scratch_configs():
    names = [name for name, _ in FROM_SCRATCH]
    assert {"tiny.py", "files.py", "multi30k.py"} <= set(names), names


@pytest.fixture(scope="module")
def public_text(tmp_path_factory):
    """Multi30K's public validation split, de and en sides (the pairs and the text)."""
    folder = os.path.join(os.environ["DPNMT_DATA_DIR"], "multi30k")
    sides = {}
    for lang in ("de", "en"):
        with open(os.path.join(folder, f"validation.{lang}"), encoding="utf-8") as f:
            sides[lang] = f.read().splitlines()
    path = tmp_path_factory.mktemp("public") / "validation.de-en.txt"
    path.write_text("\n".join(sides["de"] + sides["en"]) + "\n", encoding="utf-8")
    return sides, str(path)


def _initial_loss(config, tokenizer, sides) -> float:
    """Mean per-token cross-entropy of a fresh model (no dropout) on real pairs."""
    model, model_config, params = pieces.build_model(
        RunConfig.of(config).model, tokenizer, jax.random.PRNGKey(config.seed)
    )
    sources = tokenizer.encode(sides["de"][:NUM_PAIRS], max_length=config.data.max_source_length)
    labels = tokenizer.encode(sides["en"][:NUM_PAIRS], max_length=config.data.max_target_length)

    def pad(rows, length):
        ids = np.full((len(rows), length), tokenizer.pad_id, np.int32)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
        return ids

    input_ids = pad(sources, max(map(len, sources)))
    label_ids = pad(labels, max(map(len, labels)))
    attention_mask = (input_ids != tokenizer.pad_id).astype(np.int32)
    target_mask = np.zeros_like(label_ids, dtype=bool)
    for i, row in enumerate(labels):
        target_mask[i, : len(row)] = True
    logits = model.apply(
        {"params": params},
        input_ids,
        attention_mask,
        models.decoder_inputs(model_config, label_ids),
        deterministic=True,
    )
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), label_ids)
    return float(jnp.sum(jnp.where(target_mask, losses, 0.0)) / target_mask.sum())


@needs_data
@pytest.mark.parametrize("name,config", DISTINCT, ids=[name for name, _ in DISTINCT])
def test_initial_loss_is_near_log_vocabulary(name, config, public_text):
    sides, text_path = public_text
    tokenizer, _ = tokenizers.train_sentencepiece(
        [text_path], vocab_size=config.tokenizer.vocab_size
    )
    loss = _initial_loss(config, tokenizer, sides)
    log_vocab = math.log(tokenizer.vocab_size)
    assert abs(loss - log_vocab) <= MARGIN_NATS, (
        f"{name}: initial loss {loss:.2f} nats/token, log V = {log_vocab:.2f} "
        f"(V = {tokenizer.vocab_size}); from-scratch init gives logits far from uniform."
    )
