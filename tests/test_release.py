"""Export a tiny trained run to transformers and translate own text with it.

One module fixture trains a 2-step DP run (eps8, DP-SentencePiece vocabulary) on
the WMT sample; the tests export it, load it back in transformers, and
translate a file with `dpnmt.translate`.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers

from dpnmt import fault_points, manifest, release
from dpnmt.config import RunConfig
from dpnmt.data import tokenizers
from dpnmt.errors import MissingInputError
from dpnmt.training import loop, pieces
from tests.markers import needs_data
from tests.small_configs import small_config

pytestmark = [pytest.mark.slow, needs_data]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_NEW = 8
SOURCES = ["Ein Hund läuft über die Wiese.", "", "Das ist gut.", "  ", "Wir haben es geschafft."]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(workdir, export dir, card) of a finished 2-step run."""
    workdir = tmp_path_factory.mktemp("run")
    # small_config fixes the noise seed (test-only switch: ε is reported as ∞),
    # so the model, and the byte-level outputs compared below, are deterministic.
    config = small_config("eps8")
    config.data.max_train_examples = 96
    config.data.max_eval_examples = config.data.max_test_examples = 4
    config.model.d_model, config.model.d_ff, config.model.d_kv = 32, 64, 8
    config.eval.max_new_tokens = MAX_NEW
    # Near its random init, with an untied head (T5 v1.1 layout): diverse outputs
    # (a random tied T5 v1.0 repeats its decoder-start token, pad, which decodes to "").
    config.model.feed_forward_proj = "gated-gelu"
    config.train.learning_rate = 1e-7
    loop.train_and_evaluate(RunConfig.of(config), str(workdir))
    out = tmp_path_factory.mktemp("export") / "model"
    card = release.export_run(str(workdir), str(out))
    return workdir, out, card


def _app(*args, stdin=None, env=None):
    env = dict(os.environ, PYTHONPATH=REPO, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        input=stdin,
        timeout=600,
    )


def test_export_writes_a_transformers_folder_and_a_model_card(run):
    workdir, out, card = run
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "README.md"} <= names
    assert {"spiece.model", "tokenizer.json", "dpnmt.json"} <= names
    results = json.loads((workdir / "results.json").read_text())
    privacy = results["privacy"]

    def shown(value):  # results.json stores ε = ∞ as the string "inf".
        return value if isinstance(value, str) else f"{value:.6g}"

    assert shown(privacy["total_epsilon"]) in card and shown(privacy["dp_sgd_delta"]) in card
    assert privacy["sampling"] in card and results["test"]["bleu_signature"] in card
    assert "does not cover" in card and "validation data" in card and "hyper-parameter" in card
    # The privacy record travels with the model: a run fine-tuning it composes it.
    settings = json.loads((out / "dpnmt.json").read_text())
    assert settings["privacy"] == privacy
    # The run's decoding travels too: dpnmt.translate's defaults and transformers' generate's.
    decoding = RunConfig.of(small_config("eps8")).eval.decoding() | {"max_new_tokens": MAX_NEW}
    assert {name: settings[name] for name in decoding} == decoding
    assert json.loads((out / "generation_config.json").read_text())["max_new_tokens"] == MAX_NEW
    # Its training corpora, by public name: a DP run's export holds no digest of private text.
    assert settings["training_corpora"] == [{"corpus": "wmt16"}]
    private_dir = workdir / "private"
    for path in private_dir.rglob("*"):  # Nothing from private/ reaches the card.
        if path.is_file() and path.stat().st_size < 10_000:
            for value in json.loads(path.read_text()).values() if path.suffix == ".json" else []:
                if isinstance(value, int) and value > 10**6:
                    assert str(value) not in card
    # Same ids from the run's tokenizer and AutoTokenizer on the test split.
    ours = tokenizers.SentencePieceTokenizer.load(str(workdir / "tokenizer.model"))
    theirs = transformers.AutoTokenizer.from_pretrained(str(out))
    texts = [line for line in SOURCES if line.strip()] + [
        r["de"]
        for r in pieces.load_corpus(RunConfig.of(small_config("eps8")).data)["test"]["translation"][
            :300
        ]
    ]
    assert ours.encode(texts) == theirs(texts)["input_ids"]


def test_translate_keeps_lines_and_equals_transformers_greedy(run, tmp_path):
    workdir, out, _ = run
    source = tmp_path / "in.txt"
    source.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    target = tmp_path / "out.txt"
    flags = [f"--input={source}", f"--output={target}", f"--max_length={MAX_NEW}", "--batch_size=2"]
    result = _app("dpnmt.translate", f"--workdir={workdir}", *flags)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = target.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == len(SOURCES)
    assert lines[1] == lines[3] == "" and all(lines[i] for i in (0, 2, 4))

    # The exported folder gives the same lines, in dpnmt and in transformers.
    translator = release.load_translator(model_dir=str(out))
    again = release.translate_lines(
        translator, SOURCES, batch_size=2, num_beams=1, max_new_tokens=MAX_NEW
    )
    # Same line structure. The texts themselves are byte-level junk from a
    # near-random model, which SentencePiece and the exported tokenizers library
    # turn into replacement characters differently; their ids are compared on
    # real text in tests/data/test_hf_tokenizer.py.
    assert len(again) == len(lines) and [bool(x) for x in again] == [bool(x) for x in lines]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(out)).eval()
    settings = json.loads((out / "dpnmt.json").read_text())
    texts = [settings["source_prefix"] + SOURCES[i] for i in (0, 2, 4)]
    # dpnmt truncates sources to max_source_length tokens, eos kept: so does this.
    batch = tokenizer(
        texts,
        return_tensors="pt",
        padding=True,
        truncation=True,
        max_length=settings["max_source_length"],
    )
    with torch.no_grad():
        tokens = model.generate(**batch, max_new_tokens=MAX_NEW, do_sample=False, num_beams=1)
    # transformers runs the export end to end. Token-for-token equality with
    # dpnmt's greedy decoding is tested in tests/models/test_export.py on models
    # whose logits have clear margins: this near-random model's top logits are
    # near ties, where PyTorch's and XLA's float rounding may pick other tokens.
    run_tokenizer = tokenizers.SentencePieceTokenizer.load(str(workdir / "tokenizer.model"))
    decoded = run_tokenizer.decode(tokens[:, 1:].tolist())
    assert len(decoded) == 3 and all(isinstance(text, str) for text in decoded)
    assert np.asarray(tokens).shape[0] == 3


def test_a_folder_without_a_run_is_refused(tmp_path):
    result = _app("dpnmt.export", f"--workdir={tmp_path}", f"--out={tmp_path / 'x'}")
    assert result.returncode == 2
    # One line, without the flags' help (absl's UsageError printed it all).
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dpnmt.export: ")
    assert "no finished or checkpointed training run" in result.stderr
    assert not (tmp_path / "x").exists()
    (tmp_path / "config.json").write_text("{}")  # A config but no checkpoint yet.
    with pytest.raises(FileNotFoundError, match="no finished or checkpointed training run"):
        release.load_translator(workdir=str(tmp_path))


def test_translate_lines_sends_only_non_blank_lines(monkeypatch):
    sent = []

    def fake_translate(model, params, tokenizer, sources, **kwargs):
        sent.extend(sources)
        return [f"<{s}>\nnext" for s in sources]

    monkeypatch.setattr("dpnmt.evaluation.translate", fake_translate)
    config = small_config("eps8")
    from dpnmt import models

    model_config = models.T5Config(vocab_size=8, d_model=4, d_kv=2, d_ff=4, num_layers=1)
    translator = release.Translator(None, None, model_config, None, "", 16)
    out = release.translate_lines(
        translator, ["a", "", " ", "b"], batch_size=2, num_beams=1, max_new_tokens=4
    )
    assert sent == ["a", "b"] and out == ["<a> next", "", "", "<b> next"]
    del config


def test_a_checkpoint_only_export_says_when_validation_is_private(run, tmp_path):
    workdir, _, _ = run
    copy = tmp_path / "run"
    shutil.copytree(workdir, copy)
    (copy / "results.json").unlink()  # As if interrupted after its checkpoint.
    card = release.export_run(str(copy), str(tmp_path / "model"))
    assert pieces.validation_is_carved_from_train(
        pieces.load_corpus(RunConfig.of(small_config("eps8")).data)
    )
    line = next(x for x in card.splitlines() if "validation carved from the private" in x)
    assert "True" in line, line


def test_decode_and_export_report_the_pretrained_claim_recorded_at_start(run, tmp_path, caplog):
    """Decode and a checkpoint-only export read the base model's dpnmt.json again at report
    time: a base folder replaced after training changed (here lowered) the published ε."""
    from dpnmt.evaluation import decode  # noqa: PLC0415

    _, exported, _ = run
    base = tmp_path / "base"
    shutil.copytree(exported, base)
    settings_path = base / release.SETTINGS_FILE

    def set_record(epsilon):
        settings = json.loads(settings_path.read_text())
        settings.pop("ledger", None)  # An export from before the ledger: read from its record.
        settings["privacy"] = {
            "private": True,
            "adjacency": "add/remove one training example (Poisson-sampled Gaussian)",
            "total_epsilon": epsilon,
            "total_delta": 1e-9,
        }
        settings_path.write_text(json.dumps(settings))
        manifest.write(str(base))  # Exported so: its files are the ones listed.

    set_record(3.0)
    config = small_config("eps8")
    config.data.max_train_examples = 96
    config.data.max_eval_examples = config.data.max_test_examples = 4
    config.model.update(d_model=32, d_ff=64, d_kv=8, feed_forward_proj="gated-gelu")
    config.model.name_or_path, config.model.family = str(base), "none"
    config.tokenizer.kind = "auto"
    config.eval.max_new_tokens = MAX_NEW
    workdir = tmp_path / "second"
    loop.train_and_evaluate(RunConfig.of(config), str(workdir))
    assert json.loads((workdir / "pretrained.json").read_text())["epsilon"] == 3.0
    (workdir / "results.json").unlink()  # Checkpoint only: the report is made again.
    set_record(0.1)  # The base folder replaced after training.

    def reported():
        out = tmp_path / f"model{len(os.listdir(tmp_path))}"
        release.export_run(str(workdir), str(out))
        exported = json.loads((out / release.SETTINGS_FILE).read_text())["privacy"]
        run_config = decode.load_run_config(str(workdir))
        decoded = decode.decode_and_score(run_config, str(workdir), split="test", max_examples=1)
        return exported["pretrained"]["epsilon"], decoded["privacy"]["pretrained"]["epsilon"]

    assert reported() == (3.0, 3.0)
    (workdir / "pretrained.json").unlink()  # A run from before the record: read now, said.
    with caplog.at_level("WARNING"):
        assert reported() == (0.1, 0.1)
    assert "has no pretrained.json" in caplog.text


def _refusals(folder) -> tuple[str, str]:
    """(a private run's one-line refusal of `folder` as its start, translate's)."""
    from dpnmt.training import pretrained_privacy  # noqa: PLC0415 - reads the starting model.

    config = small_config("eps8")
    config.model.name_or_path = str(folder)
    (problem,) = pretrained_privacy.pretrained_problems(RunConfig.of(config))
    with pytest.raises(MissingInputError) as refused:
        release.load_translator(model_dir=str(folder))
    return problem, str(refused.value)


def test_an_export_without_its_record_is_no_start_and_translates_nothing(run, tmp_path):
    _, out, _ = run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("dpnmt.json"))
    for line in _refusals(copy):
        assert "is a dpnmt export without its privacy record (dpnmt.json" in line
        assert "\n" not in line and "python -m dpnmt.export" in line
    # The whole export is read as one (its record: ε = ∞ here, the test's fixed seed).
    from dpnmt.training import pretrained_privacy  # noqa: PLC0415 - reads the starting model.

    config = small_config("eps8")
    config.model.name_or_path = str(out)
    claim = pretrained_privacy.pretrained_claim(RunConfig.of(config), refuse=False)
    assert claim.dpnmt_export and claim.record is not None
    (problem,) = pretrained_privacy.pretrained_problems(RunConfig.of(config))
    assert "without its privacy record" not in problem


def test_an_export_lists_its_files_and_a_changed_one_is_no_start(run, tmp_path):
    _, out, _ = run
    listed = manifest.read(str(out))
    assert sorted(listed) == sorted(p.name for p in out.iterdir() if p.name != manifest.FILE)
    assert manifest.problems(str(out)) == []
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    with open(copy / "model.safetensors", "r+b") as f:  # Cut short after the export.
        f.truncate(1000)
    for line in _refusals(copy):
        assert "its files are not the ones exported (model.safetensors: its sha256" in line
        assert "\n" not in line


def test_the_export_app_prints_one_line_without_library_logs(run, tmp_path):
    workdir, _, _ = run
    # Killed (kill -9) after the weights, before dpnmt.json: --out is not there at all,
    # and what the kill left is refused as a start and by translate.
    killed = _app(
        "dpnmt.export",
        f"--workdir={workdir}",
        f"--out={tmp_path / 'model'}",
        env={fault_points.ENV_VAR: fault_points.EXPORT_WEIGHTS_WRITTEN},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    assert not (tmp_path / "model").exists()
    (left,) = tmp_path.iterdir()  # Hidden: never published, nor mistaken for the model.
    assert left.name.startswith(".tmp-model-") and not (left / "dpnmt.json").exists()
    assert (left / "model.safetensors").exists()
    for line in _refusals(left):
        assert "is a dpnmt export without its privacy record" in line
    # The same command again exports the run whole.
    result = _app("dpnmt.export", f"--workdir={workdir}", f"--out={tmp_path / 'model'}")
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.startswith(f"Exported {workdir} to {tmp_path / 'model'}")
    # Orbax's restore lines, JAX's backend probe and transformers' progress bars stay quiet.
    assert result.stderr.strip() == "", result.stderr[-4000:]
