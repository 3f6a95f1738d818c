"""The public vocabulary of named corpora: cached by content, ε 0, never the private corpus."""

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from dpnmt import config_lib
from dpnmt.config import RunConfig
from dpnmt.data import public_checks, public_vocab
from dpnmt.errors import ConfigError
from dpnmt.training import pieces, preflight, setup
from tests.data.conftest import generated_sentences


def _corpus(folder, seed, rows=600):
    folder.mkdir(parents=True)
    de, en = generated_sentences(rows, seed), generated_sentences(rows, seed + 100)
    for split, (lo, hi) in (
        ("train", (0, rows - 20)),
        ("validation", (-20, -10)),
        ("test", (-10, None)),
    ):
        lines = ["en\tde", *(f"{e}\t{d}" for d, e in zip(de[lo:hi], en[lo:hi], strict=True))]
        (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(public_vocab.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _spec(*folders, vocab_size=300):
    return public_vocab.PublicVocabSpec.create(
        ",".join(f"files:{f}" for f in folders), "en-de", vocab_size
    )


def test_built_once_then_cached_keyed_by_content_not_path(tmp_path, cache):
    a = _corpus(tmp_path / "one" / "a", seed=1)
    first = public_vocab.build_public_vocabulary(_spec(a))
    assert first.built and first.folder.startswith(str(cache))
    again = public_vocab.build_public_vocabulary(_spec(a))
    assert not again.built and again.folder == first.folder
    assert again.tokenizer.fingerprint == first.tokenizer.fingerprint
    # The same text elsewhere, or the other direction: the same vocabulary.
    moved = shutil.copytree(a, tmp_path / "two" / "b")
    assert public_vocab.build_public_vocabulary(_spec(moved)).folder == first.folder
    flipped = public_vocab.PublicVocabSpec.create(f"files:{a}", "de-en", 300)
    assert public_vocab.build_public_vocabulary(flipped).folder == first.folder
    # Other text or options: another vocabulary.
    other = _corpus(tmp_path / "c", seed=2)
    assert public_vocab.build_public_vocabulary(_spec(other)).folder != first.folder
    assert public_vocab.build_public_vocabulary(_spec(a, vocab_size=320)).folder != first.folder


def test_record_says_public_epsilon_zero_and_holds_no_path(tmp_path, cache):
    a, b = _corpus(tmp_path / "a", seed=1), _corpus(tmp_path / "b", seed=3)
    built = public_vocab.build_public_vocabulary(_spec(a, b))
    record = built.record
    assert record.kind == "sentencepiece_public" and record.covered_by_guarantee
    assert record.epsilon == 0.0 and record.delta == 0.0
    corpora_info = record.details["public_corpora"]
    assert [c["sentences"] for c in corpora_info] == [2 * 580, 2 * 580]  # Train, both sides.
    # Corpora are named by their folder's name, never located (the record is published).
    assert [c["name"] for c in corpora_info] == ["files:a", "files:b"]
    assert "files:a, files:b" in record.note
    assert str(tmp_path) not in json.dumps(dataclasses.asdict(record))
    # The cache holds the model and what the key hashes: no name, no path.
    folder = cache / "vocab" / record.details["cache_key"]
    assert sorted(os.listdir(folder)) == ["key.json", "spm.model"]
    on_disk = (folder / "key.json").read_text()
    assert str(tmp_path) not in on_disk and "files:" not in on_disk
    # A later run naming the same text otherwise finds the model, with its own names.
    copy = shutil.copytree(a, tmp_path / "elsewhere" / "copy_of_a")
    again = public_vocab.build_public_vocabulary(_spec(copy, b))
    assert not again.built and again.folder == built.folder
    assert [c["name"] for c in again.record.details["public_corpora"]] == [
        "files:copy_of_a",
        "files:b",
    ]
    assert "files:copy_of_a, files:b" in again.record.note
    assert str(tmp_path) not in json.dumps(dataclasses.asdict(again.record))
    detok = public_vocab.PublicVocabSpec.create(f"detok:files:{a}/", "en-de", 300)
    assert public_vocab._record_names(detok) == ["detok:files:a"]


def test_a_run_copies_the_public_vocabulary_into_its_workdir(tmp_path, cache):
    a = _corpus(tmp_path / "a", seed=1)
    config = config_lib.make_config("nonprivate")
    config.data.pair = "de-en"
    config.tokenizer.kind = "sentencepiece_public"
    config.tokenizer.public_corpora = f"files:{a}"
    config.tokenizer.vocab_size = 300
    no_private = {"train": {"translation": []}}  # The public vocabulary reads none of it.
    tokenizer, record = pieces.build_tokenizer(
        RunConfig.of(config), no_private, str(tmp_path / "run"), noise_seed=None
    )
    assert record.epsilon == 0.0
    assert (tmp_path / "run" / "tokenizer.model").exists()
    for name in os.listdir(tmp_path / "run"):  # What the workdir publishes locates nothing.
        assert str(tmp_path).encode() not in (tmp_path / "run" / name).read_bytes(), name
    run = RunConfig.of(config)
    spec = public_vocab.PublicVocabSpec.from_sections(run.tokenizer, run.data.pair)
    cached = public_vocab.build_public_vocabulary(spec)
    assert not cached.built and cached.tokenizer.fingerprint == tokenizer.fingerprint


def _private_config(private_folder, public):
    config = config_lib.make_config("eps8")
    config.data.corpus = f"files:{private_folder}"
    config.data.pair = "de-en"
    config.tokenizer.kind = "sentencepiece_public"
    config.tokenizer.public_corpora = public
    return config


def test_the_private_corpus_is_refused_as_public_however_it_is_named(tmp_path, monkeypatch):
    private = _corpus(tmp_path / "data" / "private", seed=1)
    public = _corpus(tmp_path / "data" / "public", seed=2)
    monkeypatch.setenv("DPNMT_DATA_DIR", str(tmp_path / "data"))
    for name in (f"files:{private}", "files:private", f"detok:files:{private}/"):
        problems = preflight.config_problems(
            RunConfig.of(_private_config(private, f"files:{public},{name}")), device_count=1
        )
        assert any("private training data" in p for p in problems), (name, problems)
    fine = _private_config(private, "files:public")
    assert not preflight.config_problems(RunConfig.of(fine), device_count=1)


def _partial_copy(folder, private, rows):
    """A public corpus whose train split ends with `rows` private train pairs, reversed."""
    lines = (private / "train.tsv").read_text(encoding="utf-8").splitlines()[1 : rows + 1]
    with open(folder / "train.tsv", "a", encoding="utf-8") as f:
        f.write("".join(f"{line.upper()}\n" for line in reversed(lines)))  # Re-cased too.
    return folder


def test_the_private_corpus_is_refused_as_public_by_its_text(tmp_path, monkeypatch):
    """A copy under another name, or a few private pairs in a public corpus: its text decides."""
    private = _corpus(tmp_path / "data" / "private", seed=1)
    shutil.copytree(private, tmp_path / "data" / "copy")
    _corpus(tmp_path / "data" / "public", seed=2)
    _partial_copy(_corpus(tmp_path / "data" / "some", seed=3), private, rows=10)  # 1.7%
    _partial_copy(_corpus(tmp_path / "data" / "few", seed=4), private, rows=5)  # 0.9%
    monkeypatch.setenv("DPNMT_DATA_DIR", str(tmp_path / "data"))

    def config(public):
        config = _private_config(private, public)
        config.train.expected_lot_size = 16
        config.dp.noise_multiplier = 1.0  # Given σ: no calibration (fast).
        return config

    cases = [
        ("files:copy", "'files:copy' holds about 100% of the distinct de sentences of the train"),
        ("detok:files:copy", "'detok:files:copy' holds about 100% of the distinct de"),
        ("files:public,files:some", "'files:some' holds more than 1% of the distinct de sent"),
    ]
    for public, expected in cases:
        assert not preflight.config_problems(RunConfig.of(config(public)), device_count=1), public
        workdir = tmp_path / "run"
        with pytest.raises(ConfigError) as error:
            setup.build_run(RunConfig.of(config(public)), str(workdir))
        message = str(error.value)
        assert expected in message and "not public" in message, message
        assert "distinct en sentences" in message and "dp_sentencepiece" in message
        assert " 580 " not in message  # No exact count of a private split.
        assert not workdir.exists()  # Refused before anything is written.
    # Public text sharing no sentence, or under 1% of a side, is accepted.
    for public in ("files:public", "files:public,files:few"):
        workdir = tmp_path / "fine"
        preflight.check_run(
            RunConfig.of(config(public)), str(workdir), load_corpus=pieces.load_corpus
        )
        assert not workdir.exists()


def test_public_corpora_need_the_runs_pair(tmp_path):
    public = _corpus(tmp_path / "public", seed=2)
    config = _private_config(tmp_path / "nowhere", f"files:{public}")
    config.data.pair = "fr-en"
    run = RunConfig.of(config)
    problems = public_checks.public_corpora_problems(run.tokenizer, run.data, run.dp)
    assert problems and "fr-en" in problems[0], problems


REPO = pathlib.Path(__file__).resolve().parents[2]


def _run_app(*flags: str) -> subprocess.CompletedProcess:
    """`python -m dpnmt.public_vocab <flags>` from the repository, this checkout's dpnmt."""
    command = [sys.executable, "-m", "dpnmt.public_vocab", *flags]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


def test_the_app_builds_it_ahead_and_measures_pieces_per_sentence(tmp_path, cache):
    a = _corpus(tmp_path / "a", seed=1)
    done = _run_app(
        f"--corpora=files:{a}",
        "--pair=de-en",
        "--vocab_size=300",
        f"--measure=files:{a}",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    assert summary["built_now"] and summary["folder"].startswith(str(cache))
    assert summary["record"]["epsilon"] == 0.0
    measured = summary["pieces_per_sentence"]
    assert measured["split"] == "validation" and measured["de"]["sentences"] == 10
    assert 0 < measured["en"]["mean"] <= measured["en"]["p95"]
    # Then a run with the same corpora finds it in the cache.
    spec = public_vocab.PublicVocabSpec.create(f"files:{a}", "de-en", 300)
    assert not public_vocab.build_public_vocabulary(spec).built


def test_the_app_refuses_to_measure_a_dp_configs_private_train_split(tmp_path, cache):
    """Statistics of a DP run's train split are private: the app measures validation instead."""
    private, public = _corpus(tmp_path / "private", seed=1), _corpus(tmp_path / "public", seed=2)
    done = _run_app(
        f"--config={REPO / 'configs' / 'multi30k.py'}:eps8",
        f"--config.data.corpus=files:{private}",
        f"--config.tokenizer.public_corpora=files:{public}",
        "--config.tokenizer.vocab_size=300",
        f"--measure=files:{private}/",  # Another spelling of the same folder.
        "--measure_split=train",
    )
    assert done.returncode != 0 and "private training data" in done.stderr, done.stderr[-2000:]
    assert "--measure_split=validation" in done.stderr
    assert not cache.exists()  # Refused before any vocabulary is built.
    # The same corpus's train split under a non-private config is its data to measure.
    nonprivate = config_lib.make_config("nonprivate")
    nonprivate.data.corpus = f"files:{private}"
    nonprivate = RunConfig.of(nonprivate)
    assert not public_checks.measure_split_problems(nonprivate, f"files:{private}", "train")
    dp = RunConfig.of(_private_config(private, f"files:{public}"))
    assert public_checks.measure_split_problems(dp, f"files:{private}", "train")
    assert not public_checks.measure_split_problems(dp, f"files:{private}", "validation")
    assert not public_checks.measure_split_problems(dp, f"files:{public}", "train")


def test_measuring_a_dp_configs_private_data_under_another_name_or_split_is_refused(
    tmp_path, cache
):
    """A carved validation split, or a copy of the corpus, is the private train data."""
    private, public = _corpus(tmp_path / "private", seed=1), _corpus(tmp_path / "public", seed=2)
    (private / "validation.tsv").unlink()  # Validation carved from train, as for wmt16.
    shutil.copytree(private, tmp_path / "copy")  # Its train split, renamed.
    shutil.copy(public / "validation.tsv", tmp_path / "copy")
    dp = _private_config(private, f"files:{public}")
    dp.data.validation_size = 20
    dp = RunConfig.of(dp)
    own = pieces.load_corpus(dp.data)

    def problems(measure, split):
        options = public_checks.measure_options(dp.data, measure)
        measured = public_vocab.load_measured(measure, "de-en", **options)
        return public_checks.measured_content_problems(dp, measure, split, measured, own)

    (carved,) = problems(f"files:{private}/", "validation")
    assert "carved from its train split" in carved
    (copy,) = problems(f"files:{tmp_path / 'copy'}", "train")
    assert "holds about 100% of the distinct de sentences of the train split" in copy
    assert "of the validation split" in copy and " 560 " not in copy
    assert not problems(f"files:{private}", "test")  # Its own test split is public.
    assert not problems(f"files:{public}", "train")
    # The app refuses the copy before building any vocabulary.
    done = _run_app(
        f"--config={REPO / 'configs' / 'multi30k.py'}:eps8",
        f"--config.data.corpus=files:{private}",
        "--config.data.validation_size=20",
        f"--config.tokenizer.public_corpora=files:{public}",
        "--config.tokenizer.vocab_size=300",
        f"--measure=files:{tmp_path / 'copy'}",
        "--measure_split=train",
    )
    assert done.returncode != 0 and "holds about 100%" in done.stderr, done.stderr[-2000:]
    assert not cache.exists()


def test_the_app_refuses_a_config_file_with_a_misspelt_field(tmp_path, cache):
    """`data.corpuss` must not leave the private corpus at its default, unnamed by the checks."""
    private = _corpus(tmp_path / "private", seed=1)
    config_file = tmp_path / "typo.py"
    config_file.write_text(
        "from dpnmt import config_lib\n\n\ndef get_config():\n"
        "    c = config_lib.base_config()\n"
        f"    c.data.corpuss = 'files:{private}'\n"
        "    return c\n"
    )
    done = _run_app(
        f"--config={config_file}",
        f"--measure=files:{private}",
        "--measure_split=train",
    )
    assert done.returncode != 0 and "did you mean data.corpus?" in done.stderr, done.stderr[-2000:]
    assert not cache.exists()
