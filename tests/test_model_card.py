"""The model card says which parameters DP-SGD trained (pure rendering, no run)."""

import pytest

from dpnmt import model_card

PRIVACY = {"private": True, "total_epsilon": 8.0, "total_delta": 1e-8, "bound": "Poisson"}


def _card(**model):
    config = {"data": {"pair": "de-en"}, "model": {"name_or_path": "base", **model}}
    return model_card.render(config, PRIVACY, None, steps_done=3)


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
