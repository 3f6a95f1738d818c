"""Exported checkpoints: transformers' logits and greedy outputs equal dpnmt's, and reload."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from dpnmt import models
from dpnmt.models import decoding, export
from tests.models import hf_models

MAX_NEW = 8


def _export(kind, diverse, path):
    """dpnmt's (config, model, params) and transformers' model loaded from their export."""
    config, model, params = hf_models.convert_model(hf_models.hf_model(kind, diverse=diverse))
    params = jax.tree.map(jnp.asarray, params)
    export.save_pretrained(params, config, str(path))
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(path)).eval()
    return config, model, params, hf


@pytest.mark.parametrize("kind", ["t5_v1", "mt5", "mbart"])
def test_export_matches_dpnmt_and_reloads(kind, tmp_path):
    config, model, params, hf = _export(kind, False, tmp_path / "plain")
    assert {"config.json", "model.safetensors", "generation_config.json"} <= {
        p.name for p in (tmp_path / "plain").iterdir()
    }
    ids, mask, dec, dec_mask = hf_models.padded_batch(seed=5, batch=4, src_len=12, tgt_len=6)
    expected = hf_models.hf_logits(hf, ids, mask, dec, dec_mask)
    logits = model.apply({"params": params}, *map(jnp.asarray, (ids, mask, dec, dec_mask)))
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-4, rtol=0)

    # Export -> load_pretrained gives the same parameters, tied or not.
    reloaded_model, reloaded, _ = models.load_pretrained(str(tmp_path / "plain"))
    assert reloaded_model.config == config
    jax.tree.map(np.testing.assert_array_equal, reloaded, params)

    # Greedy decoding, on T5 v1.0's diverse init (else one token repeated).
    config, model, params, hf = _export(kind, True, tmp_path / "diverse")
    gen = decoding.from_model_config(config, MAX_NEW, num_beams=1, forced_eos_token_id=None)
    ours, _ = decoding.generate(model, params, jnp.asarray(ids), jnp.asarray(mask), gen)
    with torch.no_grad():
        theirs = hf.generate(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            num_beams=1,
            forced_eos_token_id=None,
        ).numpy()[:, 1:]
    assert len(np.unique(theirs)) > 2
    np.testing.assert_array_equal(np.asarray(ours)[:, : theirs.shape[1]], theirs)


def test_state_dict_is_the_inverse_of_convert():
    config, _, params = hf_models.convert_model(hf_models.hf_model("t5_v11"))
    state_dict = export.to_state_dict(params, config)
    assert "lm_head.weight" in state_dict and "encoder.embed_tokens.weight" in state_dict
    back = models.convert_state_dict(state_dict, config)
    jax.tree.map(np.testing.assert_array_equal, back, params)
