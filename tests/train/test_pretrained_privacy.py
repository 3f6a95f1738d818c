"""A dpnmt export given back as `model.name_or_path`: its own ε composes, or the run refuses.

The export folders here are made without training (a tiny T5 and a public
SentencePiece vocabulary saved as `dpnmt.export` saves them) with the
privacy record a run would have published in its `dpnmt.json`.
"""

import dataclasses
import json
import math
import shutil

import pytest

from dpnmt.config import RunConfig
from dpnmt.data import tokenizers
from dpnmt.errors import ConfigError
from dpnmt.training import loop, pieces, setup
from dpnmt.training.privacy_report import PrivacyReport, privacy_report
from tests.small_configs import files_config, files_corpus
from tests.tiny_export import write_tiny_export

EXPORT_EPSILON, EXPORT_DELTA = 3.0, 2e-9
# What every export since dpnmt recorded corpora holds: a corpus that is not this run's.
EXPORT_CORPORA = [{"corpus": "files:the_exports_corpus"}]


def _record(private=True, epsilon=EXPORT_EPSILON):
    """The "privacy" object of an exported run's dpnmt.json (inf stored as "inf")."""
    return {
        "private": private,
        "dp_sgd_epsilon": epsilon - 0.5 if private else "inf",
        "dp_sgd_delta": 1e-9,
        "vocabulary": {"kind": "dp_sentencepiece", "covered_by_guarantee": True},
        "total_epsilon": epsilon if private else "inf",
        "total_delta": EXPORT_DELTA,
        "composition": "basic composition (ε and δ add) of DP-SGD and the vocabulary",
    }


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """A tiny T5 and its SentencePiece vocabulary as transformers folders (no dpnmt.json)."""
    return write_tiny_export(tmp_path_factory.mktemp("export"))


def _export(model_folder, tmp_path, record):
    """A copy of `model_folder` with a dpnmt.json holding `record` (None: no record)."""
    folder = tmp_path / "exported"
    shutil.copytree(model_folder, folder)
    settings = {"pair": "de-en", "family": "none", "source_prefix": ""}
    if record is not None:
        settings["privacy"], settings["training_corpora"] = record, EXPORT_CORPORA
    (folder / "dpnmt.json").write_text(json.dumps(settings))
    return str(folder)


def _config(tmp_path, name_or_path, variant="eps8"):
    c = files_config(tmp_path / "corpus", variant)
    c.model.name_or_path = name_or_path
    c.model.family = "none"
    c.data.max_source_length = c.data.max_target_length = 16
    return c


class _Stop(Exception):
    pass


def _stop_before_tokenizing(monkeypatch):
    def stop(*args, **kwargs):
        raise _Stop

    monkeypatch.setattr(setup, "tokenize_splits", stop)


def test_a_private_export_is_composed_into_the_run_total(model_folder, tmp_path):
    export_folder = _export(model_folder, tmp_path, _record())
    config = _config(tmp_path, export_folder)
    run = setup.build_run(RunConfig.of(config), str(tmp_path / "run"))
    # Recorded at start-up (published): a resumed run keeps it, whatever the base becomes.
    recorded = json.loads((tmp_path / "run" / "pretrained.json").read_text())
    assert recorded == json.loads(json.dumps(run.privacy.pretrained.to_json()))
    (tmp_path / "exported" / "dpnmt.json").write_text(json.dumps({"privacy": _record(epsilon=0.1)}))
    from dpnmt.training import pretrained_privacy, run_dir  # noqa: PLC0415

    resumed = pretrained_privacy.claim_at_start(
        RunConfig.of(config), run_dir.RunDir(str(tmp_path / "run")), resuming=True
    )
    assert resumed == run.privacy.pretrained and resumed.epsilon == EXPORT_EPSILON
    assert run.privacy.pretrained.dpnmt_export and run.privacy.pretrained.composed
    assert not run.privacy.pretrained.declared_disjoint
    # Its vocabulary is the export's: not "no private data used", and not counted twice.
    assert (
        "no private data" not in run.privacy.vocabulary.note
        and "export" in run.privacy.vocabulary.note
    )
    assert run.privacy.vocabulary.epsilon is None
    report = privacy_report(
        run.privacy.plan,
        run.privacy.plan.num_steps,
        run.privacy.vocabulary,
        pretrained=run.privacy.pretrained,
    )
    assert report.total_epsilon == pytest.approx(report.dp_sgd_epsilon + EXPORT_EPSILON)
    assert report.total_delta == pytest.approx(run.privacy.plan.delta + EXPORT_DELTA)
    assert "pretrained export" in report.composition
    published = report.to_json()
    assert published["pretrained"]["record"] == _record()
    assert PrivacyReport.from_json(json.loads(json.dumps(published))) == report


@pytest.mark.parametrize(
    "record, why",
    [
        (_record(private=False), "trained without DP"),
        (_record(epsilon=math.inf), "total ε is ∞"),
        (None, "without a privacy record"),
    ],
)
def test_an_export_without_a_finite_guarantee_is_refused_before_anything_is_written(
    model_folder, tmp_path, monkeypatch, record, why
):
    _stop_before_tokenizing(monkeypatch)
    config = _config(tmp_path, _export(model_folder, tmp_path, record))
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError) as error:
        loop.train_and_evaluate(RunConfig.of(config), str(workdir))
    message = str(error.value)
    assert message.startswith("model.name_or_path=") and why in message
    assert "model.pretrained_data_disjoint=True" in message
    assert not workdir.exists()


def test_data_declared_disjoint_are_not_composed_and_the_report_says_so(model_folder, tmp_path):
    record = _record(private=False)  # A public stage: non-private on public text.
    config = _config(tmp_path, _export(model_folder, tmp_path, record))
    config.model.pretrained_data_disjoint = True
    run = setup.build_run(RunConfig.of(config), str(tmp_path / "run"))
    report = privacy_report(
        run.privacy.plan,
        run.privacy.plan.num_steps,
        run.privacy.vocabulary,
        pretrained=run.privacy.pretrained,
    )
    assert report.total_epsilon == report.dp_sgd_epsilon and math.isfinite(report.total_epsilon)
    claim = report.to_json()["pretrained"]
    assert claim["declared_disjoint"] and not claim["composed"]
    assert "declared disjoint" in claim["note"] and claim["record"] == record
    # Its data's lack of a guarantee is said where the total is read, not only "not composed".
    assert "trained without DP" in claim["note"] and "no guarantee here" in claim["note"]
    assert report.composition == (
        "basic composition (ε and δ add) of DP-SGD and the vocabulary; the starting export was "
        "trained without DP: its training data have no guarantee here (declared public/disjoint "
        "by model.pretrained_data_disjoint)"
    )
    from dpnmt import model_card  # noqa: PLC0415

    card = "\n".join(model_card._privacy_section(json.loads(json.dumps(report.to_json()))))
    assert "**A starting model without a guarantee.** The pretrained export was trained " in card
    assert "with a disjoint DP-trained one, the larger of the two" in card
    assert "Two private stages" not in card


def test_a_model_that_is_not_a_dpnmt_export_carries_no_record(model_folder, tmp_path):
    from dpnmt.training import pretrained_privacy  # noqa: PLC0415 - the module under test.

    config = _config(tmp_path, str(model_folder))
    claim = pretrained_privacy.pretrained_claim(RunConfig.of(config))
    assert not claim.dpnmt_export and not claim.composed and claim.record is None
    assert "outside this report" in claim.note
    config.model.name_or_path = None
    config.model.pretrained_data_disjoint = True  # Declares nothing: refused, not ignored.
    (problem,) = pretrained_privacy.pretrained_problems(RunConfig.of(config))
    assert problem.startswith("model.pretrained_data_disjoint=True")


def _pretrained_privacy():
    from dpnmt.training import pretrained_privacy  # noqa: PLC0415 - the module under test.

    return pretrained_privacy


def test_a_private_export_without_recorded_corpora_cannot_be_declared_disjoint(tmp_path):
    """An export from before dpnmt recorded its corpora passed a disjoint declaration
    unchecked. Its private data cannot be compared with this run's: refused in one line (not
    declared, its ε composes); a non-private one stays public by the user's choice."""
    pretrained_privacy = _pretrained_privacy()
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "dpnmt.json").write_text(json.dumps({"privacy": _record()}))
    config = _config(tmp_path, str(folder))
    config.model.pretrained_data_disjoint = True
    (problem,) = pretrained_privacy.pretrained_problems(RunConfig.of(config))
    assert "stage 0 of 1 trained with DP and its corpora are not recorded" in problem
    assert "drop model.pretrained_data_disjoint" in problem
    config.model.pretrained_data_disjoint = False
    assert pretrained_privacy.pretrained_problems(RunConfig.of(config)) == []
    (folder / "dpnmt.json").write_text(json.dumps({"privacy": _record(private=False)}))
    config.model.pretrained_data_disjoint = True
    assert pretrained_privacy.pretrained_problems(RunConfig.of(config)) == []


@pytest.mark.parametrize(
    "change",
    [
        {"total_epsilon": -5.0},
        {"total_epsilon": "nan"},
        {"total_epsilon": "-inf"},
        {"total_delta": -1e-3},
        {"total_delta": 1.0},
        {"total_delta": "nan"},
        {"total_delta": None},
        {"total_epsilon": True},  # JSON true is no ε (float(True) is 1.0).
        {"total_delta": False},
    ],
)
def test_an_out_of_range_record_is_no_finite_guarantee(tmp_path, change):
    """A corrupted record (ε < 0, NaN, δ outside [0, 1)) was composed as is: a negative ε
    LOWERED the run's total. Now it is no finite guarantee: a private run refuses it."""
    from dpnmt.training import ledger, ledger_report  # noqa: PLC0415

    pretrained_privacy = _pretrained_privacy()
    record = {**_record(), **change}
    assert ledger_report.class_totals(ledger.lineage_of_record(record)).epsilon == math.inf
    folder = tmp_path / "export"
    folder.mkdir()
    settings = {"privacy": record, "training_corpora": EXPORT_CORPORA}
    (folder / "dpnmt.json").write_text(json.dumps(settings))
    config = _config(tmp_path, str(folder))
    (problem,) = pretrained_privacy.pretrained_problems(RunConfig.of(config))
    assert "is not a number" in problem and "model.pretrained_data_disjoint=True" in problem
    # Declared disjoint: parallel composition, the larger ε, so ∞: refused too.
    config.model.pretrained_data_disjoint = True
    (problem,) = pretrained_privacy.pretrained_problems(RunConfig.of(config))
    assert "is not a number" in problem and "parallel composition" in problem
    total = ledger_report.class_totals(ledger.lineage_of_record(_record()))
    assert (total.epsilon, total.delta) == (EXPORT_EPSILON, EXPORT_DELTA)


HUB_ID = "someone/dp-export"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(tmp_path, monkeypatch, files):
    """A Hugging Face hub cache holding `HUB_ID` at COMMIT with `files` ({name: text or
    None: recorded absent}); the hub itself is offline (tests/conftest.py)."""
    from huggingface_hub import constants  # noqa: PLC0415

    cache = tmp_path / "hf_cache"
    repo = cache / f"models--{HUB_ID.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    for name, text in files.items():
        folder = repo / ("snapshots" if text is not None else ".no_exist") / COMMIT
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text if text is not None else "")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    assert constants.HF_HUB_OFFLINE


def test_an_export_given_by_hub_id_is_composed(tmp_path, monkeypatch):
    """`model.name_or_path` takes hub ids, and exports are pushed to the hub; only a local
    folder's dpnmt.json was read, so a hub export's ε was silently not composed."""
    pretrained_privacy = _pretrained_privacy()
    _hub_cache(tmp_path, monkeypatch, {"dpnmt.json": json.dumps({"privacy": _record()})})
    config = _config(tmp_path, HUB_ID)
    claim = pretrained_privacy.pretrained_claim(RunConfig.of(config))
    assert claim.dpnmt_export and claim.composed
    assert (claim.epsilon, claim.delta) == (EXPORT_EPSILON, EXPORT_DELTA)


def test_a_hub_model_whose_record_cannot_be_read_is_refused_not_called_no_export(
    tmp_path, monkeypatch
):
    pretrained_privacy = _pretrained_privacy()
    _hub_cache(tmp_path, monkeypatch, {"config.json": "{}"})  # Cached, dpnmt.json never asked.
    config = _config(tmp_path, HUB_ID)
    (problem,) = pretrained_privacy.pretrained_problems(RunConfig.of(config))
    assert problem.startswith(f"model.name_or_path={HUB_ID!r}: cannot read the model's dpnmt.json")
    assert "model.pretrained_data_disjoint=True" in problem and "reachable" in problem
    # Fetching the record comes first; the declaration only where it is true.
    assert problem.index("hf_hub_download") < problem.index("Only if its training data")
    with pytest.raises(ConfigError):
        pretrained_privacy.pretrained_claim(RunConfig.of(config))
    config.model.pretrained_data_disjoint = True
    claim = pretrained_privacy.pretrained_claim(RunConfig.of(config))
    assert claim.declared_disjoint and not claim.composed and "could not be read" in claim.note
    assert str(tmp_path) not in claim.note  # Published: no cache path.
    nonprivate = _config(tmp_path, HUB_ID, variant="nonprivate")
    assert pretrained_privacy.pretrained_problems(RunConfig.of(nonprivate)) == []
    assert not pretrained_privacy.pretrained_claim(RunConfig.of(nonprivate)).composed


def test_a_hub_model_known_to_have_no_record_is_not_a_dpnmt_export(tmp_path, monkeypatch):
    pretrained_privacy = _pretrained_privacy()
    _hub_cache(tmp_path, monkeypatch, {"config.json": "{}", "dpnmt.json": None})
    claim = pretrained_privacy.pretrained_claim(RunConfig.of(_config(tmp_path, HUB_ID)))
    assert not claim.dpnmt_export and not claim.composed and "outside this report" in claim.note


def _plan_and_vocabulary(config):
    from dpnmt import privacy  # noqa: PLC0415

    plan = privacy.plan_privacy(config.dp, config.train, 1000)
    return plan, tokenizers.VocabularyRecord("pretrained", True, note="the export's")


@pytest.mark.parametrize("sampling", ["poisson", "shuffle"])
def test_an_export_for_another_adjacency_is_composed_with_a_note(tmp_path, sampling):
    """The export's ε may be for replace-with-null (shuffled) and this run's for add/remove
    (Poisson): the sum was stated as if both were for one relation."""
    from dpnmt.training import privacy_report as report_lib  # noqa: PLC0415

    pretrained_privacy = _pretrained_privacy()
    config = _config(tmp_path, "unused")
    config.dp.sampling = sampling
    plan, vocabulary = _plan_and_vocabulary(config)
    other = "shuffle" if sampling == "poisson" else "poisson"
    other_plan = dataclasses.replace(plan, sampling=other)
    export_adjacency = report_lib.adjacency(other_plan)
    folder = tmp_path / "export"
    folder.mkdir()
    record = {**_record(), "adjacency": export_adjacency}
    (folder / "dpnmt.json").write_text(json.dumps({"privacy": record}))
    config.model.name_or_path = str(folder)
    claim = pretrained_privacy.pretrained_claim(RunConfig.of(config))
    assert claim.composed and claim.adjacency == export_adjacency
    report = privacy_report(plan, plan.num_steps, vocabulary, pretrained=claim)
    assert report.total_epsilon == pytest.approx(report.dp_sgd_epsilon + EXPORT_EPSILON)
    assert "different neighbouring datasets" in report.composition
    assert export_adjacency in report.composition and report.adjacency in report.composition
    assert PrivacyReport.from_json(json.loads(json.dumps(report.to_json()))) == report
    # The same relation: no note.
    record["adjacency"] = report.adjacency
    (folder / "dpnmt.json").write_text(json.dumps({"privacy": record}))
    claim = pretrained_privacy.pretrained_claim(RunConfig.of(config))
    report = privacy_report(plan, plan.num_steps, vocabulary, pretrained=claim)
    assert "neighbouring" not in report.composition


def _export_trained_on(model_folder, tmp_path, corpus_config, record):
    """An export whose dpnmt.json records the training corpora of `corpus_config`'s run,
    as `dpnmt.release.export_run` writes them (`corpus_record.training_corpora`)."""
    from dpnmt.data import corpus_record  # noqa: PLC0415

    folder = _export(model_folder, tmp_path, record)
    settings = json.loads((tmp_path / "exported" / "dpnmt.json").read_text())
    settings[corpus_record.KEY] = corpus_record.training_corpora(RunConfig.of(corpus_config))
    (tmp_path / "exported" / "dpnmt.json").write_text(json.dumps(settings))
    return folder, settings[corpus_record.KEY]


def test_declaring_disjoint_an_export_trained_on_this_run_s_corpus_is_refused(
    model_folder, tmp_path, monkeypatch
):
    """`model.pretrained_data_disjoint=True` was the user's word alone: an export of a
    NON-private run on this very corpus (ε = ∞) was accepted and the run reported ε = 8."""
    _stop_before_tokenizing(monkeypatch)
    public_stage = _config(tmp_path, None, variant="nonprivate")  # Trained on this corpus.
    folder, recorded = _export_trained_on(model_folder, tmp_path, public_stage, _record(False))
    # Published: the corpus's name and a digest of its text, never the local path.
    assert recorded[0]["corpus"] == "files:corpus" and str(tmp_path) not in json.dumps(recorded)
    assert len(recorded[0]["train_text_digest"]) == 64
    config = _config(tmp_path, folder)
    config.model.pretrained_data_disjoint = True
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError) as error:
        loop.train_and_evaluate(RunConfig.of(config), str(workdir))
    message = str(error.value)
    assert message.startswith("model.pretrained_data_disjoint=True declares model.name_or_path=")
    assert "['files:corpus']" in message and "Unset model.pretrained_data_disjoint" in message
    assert not workdir.exists()


def test_an_export_trained_on_a_copy_of_this_run_s_corpus_found_here_is_refused(
    model_folder, tmp_path, monkeypatch
):
    """Named by folder: the recorded name resolves here (under $DPNMT_DATA_DIR) to the
    private folder, refused before the corpus is read; a reordered copy by its text."""
    pretrained_privacy = _pretrained_privacy()
    root = tmp_path / "data"
    monkeypatch.setenv("DPNMT_DATA_DIR", str(root))
    files_corpus(root / "corpus")
    config = _config(tmp_path, None)  # Its corpus: tmp_path/corpus.
    config.data.corpus = "files:corpus"  # Now root/corpus, by name.
    private = _config(tmp_path, None, variant="eps8")
    private.data.corpus = "files:corpus"
    folder, _ = _export_trained_on(model_folder, tmp_path, private, _record())  # Names only.
    config.model.name_or_path = folder
    config.model.pretrained_data_disjoint = True
    (problem,) = pretrained_privacy.pretrained_problems(RunConfig.of(config))
    assert "the same corpus as this run's private corpus" in problem
    # A reordered copy elsewhere, recorded by a name found here: refused by its text.
    rows = (root / "corpus" / "train.tsv").read_text().splitlines()
    (root / "copy").mkdir()
    for split in ("validation", "test"):
        shutil.copy(root / "corpus" / f"{split}.tsv", root / "copy" / f"{split}.tsv")
    (root / "copy" / "train.tsv").write_text("\n".join([rows[0], *reversed(rows[1:])]) + "\n")
    private.data.corpus = "files:copy"
    shutil.rmtree(tmp_path / "exported")
    folder, _ = _export_trained_on(model_folder, tmp_path, private, _record())
    assert pretrained_privacy.pretrained_problems(RunConfig.of(config)) == []  # Another name.
    (problem,) = pretrained_privacy.declared_text_problems(
        RunConfig.of(config), pieces.load_corpus(RunConfig.of(config).data)
    )
    assert "['files:copy']: the text of this run's private corpus" in problem
    # A non-private run's declaration goes into the ledger as well: checked the same.
    public = _config(tmp_path, folder, variant="nonprivate")
    public.data.corpus, public.model.pretrained_data_disjoint = "files:corpus", True
    (problem,) = pretrained_privacy.declared_text_problems(
        RunConfig.of(public), pieces.load_corpus(RunConfig.of(public).data)
    )
    assert "['files:copy']: the text of this run's private corpus" in problem


def test_an_export_trained_on_another_corpus_may_be_declared_disjoint(model_folder, tmp_path):
    from dpnmt.data import corpus_record  # noqa: PLC0415

    pretrained_privacy = _pretrained_privacy()
    other = tmp_path / "public"
    other.mkdir()
    public_stage = _config(other, None, variant="nonprivate")  # other/corpus: another text.
    for split in ("train", "validation", "test"):
        path = other / "corpus" / f"{split}.tsv"
        path.write_text(path.read_text().replace("Satz", "Zeile").replace("Sentence", "Line"))
    folder, recorded = _export_trained_on(model_folder, tmp_path, public_stage, _record(False))
    config = _config(tmp_path, folder)
    config.model.pretrained_data_disjoint = True
    corpus = pieces.load_corpus(RunConfig.of(config).data)
    digest = corpus_record.text_digest(corpus["train"])
    assert recorded[0]["train_text_digest"] != digest  # Same name "files:corpus", other text.
    assert pretrained_privacy.declared_text_problems(RunConfig.of(config), corpus) == []
    claim = pretrained_privacy.pretrained_claim(RunConfig.of(config))
    assert claim.declared_disjoint and not claim.composed
    # An export that records nothing (older, or not dpnmt's): the declaration is the user's.
    (tmp_path / "exported" / "dpnmt.json").write_text(json.dumps({"privacy": _record(False)}))
    assert pretrained_privacy.declared_text_problems(RunConfig.of(config), corpus) == []
    assert pretrained_privacy.pretrained_problems(RunConfig.of(config)) == []
