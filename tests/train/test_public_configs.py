"""Issue 27 item 8: no private data in a config's vocabulary or public stage.

Every config file's public text (`tokenizer.public_corpora`,
`tokenizer.public_text_paths`) and a public stage's corpora are public: never
Multi30K (the private corpus of the Multi30K runs) nor the run's own private
corpus. The Multi30K runs and the public stage share one public vocabulary, and
the DP-SentencePiece variant is the config the README's committed tables ran.
"""

import json
import pathlib
import re

import pytest

from dpnmt import config_lib
from dpnmt.config import fields as config_fields_lib
from dpnmt.data import corpora, public_vocab
from tests.small_configs import load_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.py"))
PRIVATE_CORPORA = ("multi30k",)  # The private side of this project's runs.


def _get_config(path, variant=None):
    return load_config(path, variant)


def _configs():
    for path in CONFIGS:
        for variant in (None, "nonprivate", "eps8"):
            try:
                yield path.name, variant, _get_config(path, variant)
            except ValueError:
                assert variant == "eps8", (path.name, variant)  # Public stages refuse DP.


CASES = list(_configs())


@pytest.mark.parametrize("name,variant,config", CASES, ids=[f"{n}:{v}" for n, v, _ in CASES])
def test_public_text_of_every_config_is_public(name, variant, config):
    public = [entry.registry_name for entry in _public_entries(config)]
    public += [str(p) for p in config.tokenizer.public_text_paths]
    for text in public:
        assert not any(private in text for private in PRIVATE_CORPORA), (name, variant, text)
    if config.dp.enabled:
        training = {e.registry_name for e in corpora.parse_corpus_names(config.data.corpus)}
        assert not training & set(public), (name, variant)
    else:  # A non-private run over several corpora is a public stage: public corpora only.
        if corpora.is_mixture(config.data.corpus):
            assert not any(p in config.data.corpus for p in PRIVATE_CORPORA), (name, variant)


def _public_entries(config):
    spec = config.tokenizer.get("public_corpora", "")
    return corpora.parse_corpus_names(spec) if spec else ()


def test_multi30k_runs_and_the_public_stage_share_one_public_vocabulary():
    specs = [
        public_vocab.PublicVocabSpec.from_config(_get_config(ROOT / "configs" / name, variant))
        for name, variant in (
            ("multi30k.py", "eps8"),
            ("multi30k.py", "nonprivate"),
            ("public_de_en.py", None),
        )
    ]
    assert specs[0] == specs[1] == specs[2]
    assert specs[0].vocab_size == 8000 and "multi30k" not in ",".join(specs[0].corpora)


@pytest.mark.parametrize("cell", ["eps8-poisson", "nonprivate-shuffle"])
def test_dp_vocab_config_is_the_committed_runs_config(cell):
    """configs/multi30k_dp_vocab.py reproduces docs/results/multi30k (its README table)."""
    privacy, sampling = cell.split("-")
    folder = ROOT / "docs" / "results" / "multi30k"
    committed = json.loads((folder / cell / "seed0" / "config.json").read_text())
    overrides = json.loads((folder / "sweep.json").read_text())["overrides"]
    config = _get_config(ROOT / "configs" / "multi30k_dp_vocab.py", f"{privacy},{sampling}")
    for text in overrides:
        field, value = text[len("--config.") :].split("=")
        config.update_from_flattened_dict(
            {field: type(config_fields_lib.field_value(config, field))(value)}
        )
    now = config_fields_lib.flatten(json.loads(config.to_json_best_effort()))
    then = config_fields_lib.flatten(committed)
    defaults = config_fields_lib.flatten(json.loads(config_lib.base_config().to_json_best_effort()))
    differ = {k for k in now.keys() | then.keys() if now.get(k) != then.get(k, defaults.get(k))}
    assert differ <= {"seed", "noise_seed"}, {k: (then.get(k), now.get(k)) for k in differ}


def test_lengths_are_measured_on_public_splits_only():
    """The docs never advise measuring a private train split; the config names its split."""
    for path in [ROOT / "README.md", *CONFIGS]:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"--measure=\S+ --measure_split=train", text), path.name
    multi30k = (ROOT / "configs" / "multi30k.py").read_text(encoding="utf-8")
    assert "public validation split" in multi30k and "0.4% of German" not in multi30k
