"""Issue 27 item 8: no private data in a config's vocabulary, public stage or hyper-parameters.

Every config file's public text (`tokenizer.public_corpora`,
`tokenizer.public_text_paths`) and a public stage's corpora are public: never
Multi30K or BSD (the private corpora of this project's runs) nor the run's own
private corpus. A fine-tuning config names its public stage (`PUBLIC_STAGE`),
whose corpora and vocabulary hold none of them either. The stand-in task that
tunes the DP hyper-parameters trains on public data and uses exactly the
Multi30K rows' recipe. The Multi30K runs and the public stage share one public
vocabulary, and the DP-SentencePiece variant is the config the README's
committed tables ran.
"""

import json
import pathlib
import re

import pytest

from dpnmt import config_lib
from dpnmt.config import RunConfig
from dpnmt.config import fields as config_fields_lib
from dpnmt.data import corpora, public_vocab
from tests.small_configs import config_module, load_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.py"))
PRIVATE_CORPORA = ("multi30k", "bsd")  # The private side of this project's runs.
# Public splits of a private corpus, by name: each is written by a script whose tests
# show it shares no sentence with the held-out split or the test split; it shares no
# PAIR with the private split by the corpus's construction (deliberately not checked
# against train: a cut that read the private split would depend on it).
PUBLIC_SPLITS = {
    "files:multi30k_val_a": "half A of Multi30K's public validation split "
    "(docs/results/public_captions/make_files.py, tests/data/test_public_captions_files.py)",
}


def _private_named(text: str) -> bool:
    """A name that is (part of) a private corpus, a listed public split aside."""
    return text not in PUBLIC_SPLITS and any(p in text for p in PRIVATE_CORPORA)


def _module(path):
    return config_module(path)


def _get_config(path, variant=None):
    return load_config(path, variant)


def _names(spec) -> set[str]:
    """Registry names of a corpus list ("files:a,detok:wmt16" -> {"a", "wmt16"})."""
    return {e.registry_name for e in corpora.parse_corpus_names(spec)} if spec else set()


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
    runs = [
        RunConfig.of(_get_config(ROOT / "configs" / name, variant))
        for name, variant in (
            ("multi30k.py", "eps8"),
            ("multi30k.py", "nonprivate"),
            ("public_de_en.py", None),
            ("multi30k_scratch_recipe.py", "eps8"),
        )
    ]
    specs = [public_vocab.PublicVocabSpec.from_sections(r.tokenizer, r.data.pair) for r in runs]
    assert specs[0] == specs[1] == specs[2] == specs[3]
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
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *CONFIGS]:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"--measure=\S+ --measure_split=train", text), path.name
    multi30k = (ROOT / "configs" / "multi30k.py").read_text(encoding="utf-8")
    assert "public validation split" in multi30k and "0.4% of German" not in multi30k


FINE_TUNING = sorted(p.name for p in CONFIGS if hasattr(_module(p), "PUBLIC_STAGE"))


def test_the_fine_tuning_configs_are_found():
    expected = {
        "multi30k_from_public.py",
        "multi30k_from_public_lora.py",
        "standin_tatoeba.py",
        "standin_tatoeba_lora.py",
        "bsd_from_public.py",
        "bsd_from_public_lora.py",
        "public_de_en_captions.py",
        "multi30k_from_captions.py",
        "multi30k_from_captions_lora.py",
    }
    assert expected <= set(FINE_TUNING)


@pytest.mark.parametrize("name", FINE_TUNING)
@pytest.mark.parametrize("variant", ["eps8", "nonprivate"])
def test_a_fine_tuning_config_starts_from_a_public_stage_of_public_data(name, variant):
    """Its public stage's corpora and vocabulary: no private corpus, not its own corpus."""
    stage_name = _module(ROOT / "configs" / name).PUBLIC_STAGE
    try:
        config = _get_config(ROOT / "configs" / name, variant)
    except ValueError:  # Itself a public stage (one started from another): refuses DP.
        assert variant == "eps8" and not _get_config(ROOT / "configs" / name, None).dp.enabled
        return
    assert config.model.name_or_path.endswith(f"/{stage_name}"), config.model.name_or_path
    assert config.tokenizer.kind == "auto" and config.model.pretrained_data_disjoint
    public = set()
    while True:  # Down the chain of public stages to the one that learnt the vocabulary.
        stage = _get_config(ROOT / "configs" / f"{stage_name}.py", None)
        assert not stage.dp.enabled, stage_name
        with pytest.raises(ValueError):
            _get_config(ROOT / "configs" / f"{stage_name}.py", "eps8")  # Public: refuses DP.
        public |= _names(stage.data.corpus) | _names(stage.tokenizer.public_corpora)
        if stage.tokenizer.kind != "auto":
            break
        assert stage.model.name_or_path.endswith(
            "/" + _module(ROOT / "configs" / f"{stage_name}.py").PUBLIC_STAGE
        )
        stage_name = _module(ROOT / "configs" / f"{stage_name}.py").PUBLIC_STAGE
    assert stage.tokenizer.kind == "sentencepiece_public", stage_name
    private = _names(config.data.corpus) | set(PRIVATE_CORPORA)
    assert public and not public & private, (name, public & private)
    assert not any(_private_named(text) for text in public), public


def test_the_captions_configs_read_the_folders_make_files_writes():
    """The stage trains on half A (a listed public split); the DP rows' train is Multi30K's."""
    make_files = config_module(ROOT / "docs" / "results" / "public_captions" / "make_files.py")
    stage = _get_config(ROOT / "configs" / "public_de_en_captions.py", None)
    rows = _get_config(ROOT / "configs" / "multi30k_from_captions.py", "eps8")
    assert stage.data.corpus == f"files:{make_files.STAGE_FOLDER}" and not stage.dp.enabled
    assert stage.data.corpus in PUBLIC_SPLITS
    assert rows.data.corpus == f"files:{make_files.HELDOUT_FOLDER}" and rows.dp.enabled
    assert rows.data.max_train_examples is None  # All 29,000 (train is linked to Multi30K's).
    lots_per_epoch = 507 // stage.train.expected_lot_size  # Half A: 507 pairs.
    assert lots_per_epoch == 4 and 100 <= lots_per_epoch * stage.train.num_epochs <= 200


@pytest.mark.parametrize(
    "variant", ["eps1", "eps3", "eps8", "nonprivate", "eps8,lora", "eps8,shuffle"]
)
def test_the_captions_rows_are_the_public_rows_but_for_start_and_corpus(variant):
    """multi30k_from_captions.py: multi30k_from_public.py's recipe and variants, unchanged."""
    captions = _get_config(ROOT / "configs" / "multi30k_from_captions.py", variant)
    public = _get_config(ROOT / "configs" / "multi30k_from_public.py", variant)
    ours, theirs = (
        config_fields_lib.flatten(json.loads(c.to_json_best_effort())) for c in (captions, public)
    )
    differ = {k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)}
    assert differ == {"data.corpus", "model.name_or_path"}, differ
    assert captions.model.name_or_path == "runs/exported/public_de_en_captions"
    with pytest.raises(ValueError, match="no scratch"):
        _get_config(ROOT / "configs" / "multi30k_from_captions.py", "eps8,scratch")


@pytest.mark.parametrize("epsilon", ["eps1", "eps3", "eps8"])
def test_the_captions_lora_file_is_the_captions_rows_lora_variant(epsilon):
    """multi30k_from_captions_lora.py: the sweep's LoRA row from the captions stage."""
    as_file = _same_config("multi30k_from_captions_lora.py", "multi30k_from_captions.py", epsilon)
    assert as_file.model.finetune == "lora" and as_file.data.corpus == "files:multi30k_heldout"


@pytest.mark.parametrize("epsilon", ["eps5", "eps1"])
def test_the_bsd_lora_file_is_the_bsd_rows_lora_variant(epsilon):
    """bsd_from_public_lora.py: the sweep's LoRA row on BSD."""
    as_file = _same_config("bsd_from_public_lora.py", "bsd_from_public.py", epsilon)
    assert as_file.model.finetune == "lora" and as_file.data.corpus == "bsd"
    assert as_file.train.learning_rate == 5e-3 and as_file.model.lora_rank > 0


def _same_config(file_name, base_name, epsilon):
    """The file's config at `epsilon`, asserted equal to the base config's lora variant."""
    as_file = _get_config(ROOT / "configs" / file_name, epsilon)
    as_variant = _get_config(ROOT / "configs" / base_name, f"{epsilon},lora")
    ours, theirs = (
        config_fields_lib.flatten(json.loads(c.to_json_best_effort()))
        for c in (as_file, as_variant)
    )
    differ = {k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)}
    assert not differ, differ
    return as_file


def test_the_standin_trains_on_public_data_of_multi30k_size():
    """The stand-in's "private" corpus is one the real public stage trains on."""
    multi30k = _module(ROOT / "configs" / "multi30k.py")
    for name in ("standin_tatoeba.py", "standin_tatoeba_lora.py"):
        config = _get_config(ROOT / "configs" / name, "eps8")
        training = _names(config.data.corpus)
        assert training and training <= _names(multi30k.PUBLIC_CORPORA), training
        assert not training & set(PRIVATE_CORPORA)
        assert config.data.max_train_examples == 29000  # Multi30K's N: the same q, T and σ.


RECIPE_FIELDS = (
    "train.expected_lot_size",
    "train.num_epochs",
    "train.learning_rate",
    "train.warmup_steps",
    "train.decay",
    "train.optimizer",
    "train.label_smoothing",
    "dp.enabled",
    "dp.target_epsilon",
    "dp.l2_clip",
    "dp.delta",
    "dp.sampling",
    "dp.accountant",
    "model.finetune",
    "model.lora_rank",
    "model.lora_alpha",
    "model.lora_targets",
    "eval.num_beams",
    "eval.length_penalty",
)


@pytest.mark.parametrize(
    "variant", ["eps1", "eps3", "eps8", "nonprivate", "eps8,lora", "eps1,lora", "eps8,shuffle"]
)
def test_the_standin_recipe_is_the_multi30k_rows_recipe(variant):
    """Values tuned on the stand-in go unchanged into the Multi30K rows (and scratch's)."""
    standin = _get_config(ROOT / "configs" / "standin_tatoeba.py", variant)
    real = _get_config(ROOT / "configs" / "multi30k_from_public.py", variant)
    rows = [real]
    if "lora" not in variant:
        rows.append(_get_config(ROOT / "configs" / "multi30k_scratch_recipe.py", variant))
    else:
        rows.append(_get_config(ROOT / "configs" / "multi30k_from_public_lora.py", variant))
        rows.append(_get_config(ROOT / "configs" / "standin_tatoeba_lora.py", variant))
    for row in rows:
        for field in RECIPE_FIELDS:
            ours, theirs = (
                config_fields_lib.field_value(standin, field),
                config_fields_lib.field_value(row, field),
            )
            assert ours == theirs, (variant, field, ours, theirs)


@pytest.mark.parametrize("epsilon", [1.0, 3.0, 8.0])
def test_the_dp_rows_use_large_poisson_lots(epsilon):
    full = _get_config(ROOT / "configs" / "multi30k_from_public.py", f"eps{epsilon:g}")
    lora = _get_config(ROOT / "configs" / "multi30k_from_public_lora.py", f"eps{epsilon:g}")
    for config in (full, lora):
        assert config.dp.enabled and config.dp.target_epsilon == epsilon
        assert config.dp.sampling == "poisson" and config.dp.delta == 1e-8
        assert config.train.expected_lot_size >= 1024
    assert lora.model.finetune == "lora" and lora.model.lora_rank >= 1
    assert lora.train.learning_rate != full.train.learning_rate  # LoRA's own rate.


def test_the_captions_rows_validate_on_the_held_out_half_only():
    """The DP rows from the captions stage never validate on its training half A."""
    stage = _get_config(ROOT / "configs" / "public_de_en_captions.py")
    assert _names(stage.data.corpus) == {"files:multi30k_val_a"}
    for variant in ("eps8", "eps1", "eps8,lora", "nonprivate"):
        config = _get_config(ROOT / "configs" / "multi30k_from_captions.py", variant)
        assert _names(config.data.corpus) == {"files:multi30k_heldout"}, variant
        assert config.model.name_or_path.endswith("/public_de_en_captions"), variant


@pytest.mark.parametrize(
    "pattern,constant",
    [
        ("docs/results/standin/*/eps8-poisson/seed0", "DP_LEARNING_RATE"),
        ("docs/results/standin_lora/*/eps8-poisson/seed0", "LORA_LEARNING_RATE"),
    ],
)
def test_the_rows_rates_are_the_committed_standin_grids_winners(pattern, constant):
    """The Multi30K rows' rates are what the tuning rule picked on the public stand-in."""
    from dpnmt.sweeps import runs_table, tuning_table

    runs, not_finished = runs_table.load_runs(runs_table.expand([str(ROOT / pattern)]))
    assert len(runs) >= 3 and not not_finished, pattern
    rows = tuning_table.choose([tuning_table.row(r) for r in runs])
    (winner,) = [r for r in rows if r["chosen"] == tuning_table.CHOSEN]
    recipe = _module(ROOT / "configs" / "multi30k_from_public.py")
    rate = getattr(recipe, constant)
    assert float(winner["learning_rate"]) == rate, (winner["run"], rate)
    lot = {"DP_LEARNING_RATE": recipe.DP_LOT, "LORA_LEARNING_RATE": recipe.LORA_LOT}[constant]
    assert winner["lot_size"] == lot, (winner["run"], lot)
