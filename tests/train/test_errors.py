"""Bad inputs fail before anything is written, in one line naming the field and the fix."""

import json
import os
import shutil

import datasets
import pytest

from dpnmt import config_lib
from dpnmt.config import RunConfig
from dpnmt.config import fields as config_fields_lib
from dpnmt.errors import ConfigError, InputError
from dpnmt.evaluation import decode as decode_lib
from dpnmt.sweeps import runner
from dpnmt.training import loop, pieces, preflight, run_dir, setup
from tests.small_configs import FILES_ROWS as ROWS
from tests.small_configs import files_config
from tests.small_configs import files_corpus as _corpus


def _config(tmp_path, variant="eps8"):
    c = files_config(tmp_path / "corpus", variant)
    c.tokenizer.vocab_size = 400
    c.noise_seed = 1
    c.testing_only_fixed_noise_seed_NO_PRIVACY = True
    return c


class _Stop(Exception):
    """Raised once the vocabulary is built: the test has seen what it needs."""


def _stop_after_vocabulary(monkeypatch):
    def stop(*args, **kwargs):
        raise _Stop

    monkeypatch.setattr(setup, "tokenize_splits", stop)


BAD_FIELDS = [
    ("train.optimizer", "adamm", "did you mean 'adam'"),
    ("train.decay", "cos", "constant"),
    ("dp.sampling", "poison", "did you mean 'poisson'"),
    ("dp.clipping", "ghostly", "vmap"),
    ("dp.accountant", "gdp", "rdp"),
    ("data.tokenize_train", "lazy", "per_lot"),
    ("tokenizer.kind", "bpe", "dp_sentencepiece"),
    ("tokenizer.model_type", "word", "unigram"),
    ("model.family", "bart", "mbart"),
    ("model.feed_forward_proj", "gated-swish", "gated-ACT"),
    ("dp.l2_clip", -1.0, "> 0"),
    ("dp.delta", 1.5, "in (0, 1)"),
    ("dp.noise_multiplier", -1.0, "> 0"),
    ("train.expected_lot_size", 0, ">= 1"),
    ("train.num_epochs", 0, ">= 1"),
    ("train.log_every_steps", 0, ">= 1"),
    ("data.max_source_length", 0, ">= 1"),
    ("data.length_buckets", "16,32", "end the list with 64"),
    ("data.length_buckets", "32,16,64", "strictly ascending"),
    ("train.physical_batch_size", 12, "multiple of the 8 devices"),
    ("data.bsd_train_split", "dev", "does not use it"),
    ("model.name_or_path", "./no/such/model", "no such folder"),
]


@pytest.mark.parametrize("field, value, fix", BAD_FIELDS)
def test_bad_field_fails_before_the_workdir_is_made(tmp_path, field, value, fix):
    config = _config(tmp_path)
    group, name = field.split(".")
    config[group][name] = value
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError) as error:
        loop.train_and_evaluate(RunConfig.of(config), str(workdir))
    message = str(error.value)
    assert "\n" not in message and message.startswith(field), message
    assert fix in message
    assert not workdir.exists()


def test_every_problem_is_reported_at_once(tmp_path):
    config = _config(tmp_path)
    config.train.optimizer, config.dp.l2_clip = "adamm", -1.0
    problems = preflight.config_problems(RunConfig.of(config), device_count=1)
    assert sorted(p.split("=")[0] for p in problems) == ["dp.l2_clip", "train.optimizer"]


def test_private_run_without_target_or_sigma_is_refused(tmp_path):
    config = _config(tmp_path)
    config.dp.target_epsilon = config.dp.noise_multiplier = None
    with pytest.raises(ConfigError, match="dp.target_epsilon.*dp.noise_multiplier"):
        loop.train_and_evaluate(RunConfig.of(config), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_lot_size_not_below_n_fails_after_reading_text_only(tmp_path):
    config = _config(tmp_path)
    config.train.expected_lot_size = 120  # N = 120 pairs.
    with pytest.raises(ConfigError, match=r"train.expected_lot_size=120 must be in \[1, N=120\)"):
        loop.train_and_evaluate(RunConfig.of(config), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_unreachable_target_epsilon_fails_before_anything_is_written(tmp_path):
    config = _config(tmp_path)
    config.dp.noise_multiplier, config.dp.target_epsilon = None, 1e-9
    with pytest.raises(ConfigError, match=r"dp.target_epsilon=1e-09 is unreachable.*N=120"):
        loop.train_and_evaluate(RunConfig.of(config), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_a_sweep_folder_is_not_a_train_workdir(tmp_path):
    (tmp_path / "sweep.json").write_text("{}")
    with pytest.raises(ConfigError, match="is a sweep folder"):
        loop.train_and_evaluate(RunConfig.of(_config(tmp_path)), str(tmp_path))
    assert not (tmp_path / run_dir.CONFIG_FILE).exists()


def test_a_train_workdir_is_not_a_sweep_folder(tmp_path):
    (tmp_path / run_dir.CONFIG_FILE).write_text("{}")
    problems = runner.sweep_workdir_problems(str(tmp_path))
    assert len(problems) == 1 and "holds a training run (config.json)" in problems[0]


def test_unknown_override_names_the_closest_field():
    known = config_fields_lib.config_fields(config_lib.base_config())
    flags = ["--config.dp.epsilon=1", "--config.seed=2"]
    problems = config_fields_lib.check_override_flags(flags, known)
    assert problems == ["--config.dp.epsilon: no field dp.epsilon; did you mean dp.target_epsilon?"]


def test_rerun_with_the_fix_proceeds_and_a_vocabulary_binds_only_its_fields(tmp_path, monkeypatch):
    workdir = tmp_path / "run"
    config = _config(tmp_path)
    config.train.optimizer = "adamm"
    with pytest.raises(ConfigError):
        loop.train_and_evaluate(RunConfig.of(config), str(workdir))
    assert not workdir.exists()
    config.train.optimizer = "adam"
    _stop_after_vocabulary(monkeypatch)
    with pytest.raises(_Stop):  # Past validation, the config and the vocabulary.
        loop.train_and_evaluate(RunConfig.of(config), str(workdir))
    assert (workdir / run_dir.TOKENIZER_FILE).exists()
    assert (workdir / run_dir.CONFIG_FILE).exists()
    config.train.learning_rate *= 2  # The vocabulary does not depend on it.
    with pytest.raises(_Stop):
        loop.train_and_evaluate(RunConfig.of(config), str(workdir))
    config.tokenizer.vocab_size *= 2  # It does: learning again would spend privacy again.
    with pytest.raises(ConfigError, match=r"fields differ: tokenizer.vocab_size: run "):
        loop.train_and_evaluate(RunConfig.of(config), str(workdir))
    config.tokenizer.vocab_size //= 2
    # Once a session trained a step (its metrics may be out), every field binds.
    (workdir / "metrics.jsonl").write_text('{"step": 0}\n{"step": 5, "epsilon": 0.1}\n')
    config.train.learning_rate *= 2
    resume_hint = r"train.learning_rate: run .*resume with the run's values: --config.train"
    with pytest.raises(ConfigError, match=rf"fields differ: {resume_hint}.learning_rate="):
        loop.train_and_evaluate(RunConfig.of(config), str(workdir))


def test_unreachable_hub_model_says_to_use_a_local_path(tmp_path):
    config = config_lib.base_config()
    config.tokenizer.kind = "pretrained"
    config.model.name_or_path = "google/mt5-small"  # The hub is offline in tests.
    with pytest.raises(OSError, match="local directory"):
        pieces.build_tokenizer(RunConfig.of(config), None, str(tmp_path), noise_seed=None)


def test_decode_of_a_folder_without_a_run_is_refused(tmp_path):
    with pytest.raises(InputError, match="config.json.*--zero_shot"):
        decode_lib.load_run_config(str(tmp_path))


def test_decode_without_a_checkpoint_names_the_real_flag(tmp_path):
    with pytest.raises(InputError, match="--zero_shot") as error:
        decode_lib.restore_params(RunConfig.of(config_lib.base_config()), str(tmp_path), {})
    assert "--pretrained" not in str(error.value)


def test_saved_vocabulary_is_required_when_not_learning(tmp_path):
    config = config_lib.base_config()  # dp_sentencepiece
    with pytest.raises(FileNotFoundError, match="not learnt again"):
        pieces.build_tokenizer(
            RunConfig.of(config), None, str(tmp_path), noise_seed=None, learn=False
        )


def test_a_fixed_noise_seed_in_a_private_run_is_refused_before_anything_is_written(tmp_path):
    """Anyone holding a fixed seed rebuilds every noise draw: true ε = ∞, not the plan's."""

    config = config_lib.make_config("eps8")
    config.noise_seed = 12345
    workdir = tmp_path / "run"
    with pytest.raises(ValueError, match=r"config\.noise_seed .*testing_only_fixed_noise_seed"):
        loop.train_and_evaluate(RunConfig.of(config), str(workdir))
    assert not workdir.exists()


def test_the_test_only_switch_needs_a_seed_and_a_nonprivate_run_may_fix_one():
    config = config_lib.make_config("eps8")
    config.testing_only_fixed_noise_seed_NO_PRIVACY = True
    with pytest.raises(ValueError, match="needs config.noise_seed"):
        config_lib.check_noise_seed(RunConfig.of(config))
    config.noise_seed = 3
    config_lib.check_noise_seed(RunConfig.of(config))  # Allowed: the run then reports ε = ∞.
    nonprivate = config_lib.make_config("nonprivate")
    nonprivate.noise_seed = 3
    config_lib.check_noise_seed(RunConfig.of(nonprivate))  # ε = ∞ anyway.


def _pairs_corpus(num_pairs=400):
    words_de = "das haus ist rot und der hund ist klein".split()
    words_en = "the house is red and the dog is small".split()
    rows = [
        {"de": " ".join(words_de[i % 5 :]), "en": " ".join(words_en[i % 5 :])}
        for i in range(num_pairs)
    ]
    return datasets.DatasetDict({"train": datasets.Dataset.from_dict({"translation": rows})})


def test_saved_tokenizer_without_record_is_never_relearnt(tmp_path, monkeypatch):
    """dpnmt.evaluation.decode.decode_and_score only checks tokenizer.model exists, then calls
    build_tokenizer(noise_seed=0): if vocabulary.json is missing, the DP
    vocabulary is LEARNT AGAIN from the private train split (spending privacy
    again, with the fixed public seed 0) and OVERWRITES the run's tokenizer.model,
    so the model is decoded with a vocabulary it was not trained with."""
    from dpnmt.data import dp_sentencepiece

    relearnt = []

    def spy(*args, **kwargs):
        relearnt.append(kwargs.get("seed"))
        raise RuntimeError("stop: the DP vocabulary was being learnt again")

    monkeypatch.setattr(dp_sentencepiece, "train_dp_sentencepiece", spy)
    config = config_lib.make_config("eps8")
    config.data.pair = "de-en"
    saved = b"the run's own tokenizer.model bytes"
    (tmp_path / run_dir.TOKENIZER_FILE).write_bytes(saved)
    try:
        pieces.build_tokenizer(RunConfig.of(config), _pairs_corpus(), str(tmp_path), noise_seed=0)
    except Exception:  # noqa: BLE001 - refusing (or failing to load) is fine.
        pass
    assert not relearnt, "a workdir's DP vocabulary was learnt again from private data"
    assert (tmp_path / run_dir.TOKENIZER_FILE).read_bytes() == saved


def _parallel_text_corpus(folder):
    """A files: corpus as line-aligned text files (train.de + train.en, ...)."""
    os.makedirs(folder, exist_ok=True)
    for split, rows in (("train", ROWS), ("validation", ROWS[:8]), ("test", ROWS[:8])):
        for side, lang in enumerate(("de", "en")):
            with open(os.path.join(folder, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.write("".join(f"{row[side]}\n" for row in rows))
    return str(folder)


def test_public_vocabulary_text_that_is_the_private_corpus_is_refused(tmp_path, monkeypatch):
    """sentencepiece_public on the run's own train text would report vocabulary ε 0."""
    _stop_after_vocabulary(monkeypatch)
    corpus = _parallel_text_corpus(tmp_path / "text")
    public = tmp_path / "public"
    public.mkdir()
    shutil.copy(os.path.join(corpus, "train.en"), public / "copy.txt")  # Same bytes.
    (public / "de_side.txt").write_text(  # The de side of the TSV corpus, as lines.
        "\n".join(row[0] for row in ROWS) + "\n", encoding="utf-8"
    )
    (public / "de_shuffled.txt").write_text(  # The same lines in another order.
        "\n".join(row[0] for row in reversed(ROWS)) + "\n", encoding="utf-8"
    )
    (public / "news.txt").write_text("Das ist ein öffentlicher Satz.\nA public line.\n")
    (public / "some.txt").write_text(  # News with 5 of the 120 train sentences (4%), re-cased.
        "A public line.\n" + "".join(f"{row[0].lower()}\n" for row in ROWS[:5]), encoding="utf-8"
    )
    (public / "copy.tsv").write_text(  # Both sides on one line, reordered, columns swapped.
        "en\tde\n" + "".join(f"{en}\t{de}\n" for de, en in reversed(ROWS)), encoding="utf-8"
    )
    (public / "copy.jsonl").write_text(  # One JSON object a pair, as Hugging Face writes them.
        "".join(json.dumps({"translation": {"de": de, "en": en}}) + "\n" for de, en in ROWS[::-1]),
        encoding="utf-8",
    )
    cases = [
        # A path that resolves to the corpus's own train file.
        (f"files:{corpus}", str(tmp_path / "text" / ".." / "text" / "train.de"), " is the "),
        (f"files:{corpus}", str(public / "copy.txt"), "has the same bytes as"),
        (f"files:{_corpus(tmp_path / 'tsv')}", str(public / "de_side.txt"), "same lines as"),
        (f"files:{_corpus(tmp_path / 'tsv')}", str(public / "de_shuffled.txt"), "same lines as"),
        (f"files:{_corpus(tmp_path / 'tsv')}", str(public / "some.txt"), " holds more than 1% "),
        (f"files:{_corpus(tmp_path / 'tsv')}", str(public / "copy.tsv"), " holds about 100% "),
        (f"files:{_corpus(tmp_path / 'tsv')}", str(public / "copy.jsonl"), " holds about 100% "),
    ]
    for corpus_name, path, how in cases:
        config = _config(tmp_path)
        config.data.corpus = corpus_name
        config.tokenizer.kind = "sentencepiece_public"
        config.tokenizer.public_text_paths = (str(public / "news.txt"), path)
        workdir = tmp_path / "run"
        with pytest.raises(ConfigError) as error:
            loop.train_and_evaluate(RunConfig.of(config), str(workdir))
        message = str(error.value)
        assert message.startswith(f"tokenizer.public_text_paths: {path}") and how in message
        assert "train split" in message and "dp_sentencepiece" in message
        assert " 120 " not in message  # No exact count of a private split.
        assert not workdir.exists()
    # Public text is accepted; so is the corpus's own text in a non-private run
    # (its data are public there: the two-stage recipe's stage 1).
    for variant, paths in (("eps8", (str(public / "news.txt"),)), ("nonprivate", cases[0][1:2])):
        config = _config(tmp_path, variant)
        config.data.corpus = f"files:{corpus}"
        config.tokenizer.kind = "sentencepiece_public"
        config.tokenizer.public_text_paths = paths
        with pytest.raises(_Stop):
            loop.train_and_evaluate(RunConfig.of(config), str(tmp_path / f"ok-{variant}"))


def test_delta_at_least_one_over_n_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    from dpnmt.data import dp_sentencepiece

    learnt = []
    real = dp_sentencepiece.train_dp_sentencepiece
    monkeypatch.setattr(
        dp_sentencepiece,
        "train_dp_sentencepiece",
        lambda *args, **kwargs: learnt.append(1) or real(*args, **kwargs),
    )
    _stop_after_vocabulary(monkeypatch)
    workdir = tmp_path / "run"
    config = _config(tmp_path)  # N = 120: 1/N = 0.00833.
    config.dp.delta = 0.01
    with pytest.raises(ConfigError) as error:
        loop.train_and_evaluate(RunConfig.of(config), str(workdir))
    message = str(error.value)
    assert message.startswith("dp.delta=0.01 + tokenizer.dp_delta=1e-09: total δ=0.01 is at ")
    assert "least 1/N = 0.00833 (N=120 training pairs" in message
    assert "dp.delta=0.0001" in message and "dp.allow_large_delta=True" in message
    # The total δ counts: DP-SGD's and the DP vocabulary's each below 1/N, not together.
    config.dp.delta = config.tokenizer.dp_delta = 0.005
    with pytest.raises(ConfigError, match=r"dp.delta=0.005 \+ tokenizer.dp_delta=0.005: total"):
        loop.train_and_evaluate(RunConfig.of(config), str(workdir))
    assert not workdir.exists() and not learnt  # Nothing written, no vocabulary ε spent.
    config.dp.allow_large_delta = True  # The explicit override.
    with pytest.raises(_Stop):
        loop.train_and_evaluate(RunConfig.of(config), str(workdir))
    assert learnt and (workdir / run_dir.CONFIG_FILE).exists()
