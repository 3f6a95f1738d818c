"""Decoder-input construction equals transformers' own shifting."""

import numpy as np
import torch
from transformers.models.mbart import modeling_mbart

from dpnmt.models import targets
from dpnmt.models.config import MBartConfig, T5Config
from tests.models import hf_models


def _labels():
    labels = np.array([[5, 6, 7, 2, 9], [8, 2, 9, 1, 1], [4, 2, 9, -100, -100]])
    return labels


def test_mbart_wrap_matches_transformers():
    labels = _labels()
    expected = modeling_mbart.shift_tokens_right(torch.tensor(labels), pad_token_id=1).numpy()
    np.testing.assert_array_equal(targets.decoder_inputs(MBartConfig(), labels), expected)
    # The language id (last real token) leads each row.
    np.testing.assert_array_equal(expected[:, 0], [9, 9, 9])


def test_t5_shift_matches_transformers():
    hf = hf_models.hf_model("mt5")
    labels = _labels()
    expected = hf._shift_right(torch.tensor(labels)).numpy()
    config = T5Config(model_type="mt5", decoder_start_token_id=0, pad_token_id=0)
    np.testing.assert_array_equal(targets.decoder_inputs(config, labels), expected)
