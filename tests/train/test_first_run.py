"""Issue 33: the README's first run is configs/first_run.py, and its plan is what the README says.

No training here (its time is measured by hand and written in the README):
the commands the README gives, the config they name, and the plan that
config resolves to.
"""

import json
import pathlib
import re

import pytest

from dpnmt import config_lib
from dpnmt.config import RunConfig
from tests.small_configs import config_module, load_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
MULTI30K_TRAIN_PAIRS = 29_000  # Multi30K task 1's train split.


def _first_translation_block() -> str:
    """The bash block of the README's "The first translation" section."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The first translation", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def test_the_readme_trains_first_run_and_translates_with_that_run():
    block = _first_translation_block()
    train = re.search(r"-m dpnmt\.train (.*?)(?:\n(?!\s)|$)", block, re.S).group(1)
    assert "--config=configs/first_run.py " in train.replace("\\\n", " ")
    workdir = re.search(r"--workdir=(\S+)", train).group(1)
    assert f"dpnmt.translate --workdir={workdir}" in block
    # No second pass over the test split: the train command scores it.
    assert "dpnmt.decode" not in block


def test_the_first_run_is_one_non_private_epoch_of_multi30k_with_the_public_vocabulary():
    run = RunConfig.parse(load_config("first_run"))
    multi30k = RunConfig.parse(load_config("multi30k", "nonprivate"))
    assert not run.dp.enabled
    assert run.data.corpus == "files:multi30k" and run.data.pair == "de-en"
    assert run.data.max_train_examples is None  # The whole train split, once.
    assert run.train.num_epochs == 1
    assert run.tokenizer == multi30k.tokenizer  # The public de+en vocabulary: no ε.
    assert run.train.eval_every_steps == 0  # Validation and test only at the end.
    assert run.eval.num_beams == 1 and not run.eval.bertscore


def test_the_readme_states_the_first_runs_lots():
    module = config_module("first_run")
    run = RunConfig.parse(load_config("first_run"))
    lots = MULTI30K_TRAIN_PAIRS // run.train.expected_lot_size  # Shuffled lots: N // L.
    assert run.train.expected_lot_size == module.LOT
    assert f"{lots} lots of {module.LOT}" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("variant", ["eps8", "nonprivate,shuffle", "lora"])
def test_the_first_run_refuses_other_variants_and_names_the_private_recipe(variant):
    with pytest.raises(ValueError, match=r"configs/multi30k\.py:eps8"):
        load_config("first_run", variant)


def test_the_readme_quotes_the_committed_first_run():
    """docs/results/first_run: the measured run (fresh clone, empty caches) the README quotes."""
    folder = ROOT / "docs" / "results" / "first_run"
    results = json.loads((folder / "results.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    # The committed run's every field as the config file gives it today; fields added to
    # the config since (with their defaults) are not in the older file.
    today = config_lib.published_config(RunConfig.parse(load_config("first_run")))
    for section, fields in config.items():
        if isinstance(fields, dict):
            assert fields == {k: v for k, v in today[section].items() if k in fields}, section
        else:
            assert fields == today[section], section
    assert not results["privacy"]["private"] and results["steps_done"] == 453
    test = results["test"]
    quoted = f"Test 2016 BLEU {test['bleu']:.1f}, chrF {test['chrf']:.1f}"
    assert quoted in " ".join((ROOT / "README.md").read_text().split())  # Lines rewrapped.
