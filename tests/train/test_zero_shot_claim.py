"""Zero-shot decodes record their model's own privacy claim, decided as a DP run on the
decode's corpus would (`evaluation.decode.zero_shot_claim`), and `dpnmt.report --starts`
states it (`sweeps.runs_table.start_epsilon`)."""

import json
import math

import pytest

from dpnmt.config import RunConfig
from tests.tiny_export import write_tiny_export
from tests.train.test_pretrained_privacy import (
    EXPORT_EPSILON,
    _config,
    _export,
    _export_trained_on,
    _record,
    _stop_before_tokenizing,
)


def _zero_shot(config, workdir: str) -> dict:
    """`dpnmt.decode --zero_shot --split=test` of `config`'s model into `workdir`."""
    from dpnmt.evaluation import decode  # noqa: PLC0415

    return decode.decode_and_score(
        RunConfig.of(config), workdir, split="test", bertscore=False, zero_shot=True
    )


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """A tiny T5 and its vocabulary as transformers folders (no dpnmt.json)."""
    return write_tiny_export(tmp_path_factory.mktemp("export"))


def test_a_zero_shot_decode_records_the_models_claim_and_a_start_row_states_it(
    model_folder, tmp_path
):
    from dpnmt.sweeps import runs_table  # noqa: PLC0415

    export_folder = _export(model_folder, tmp_path, _record())  # DP-trained, not disjoint.
    config = _config(tmp_path, export_folder, "nonprivate")
    config.eval.max_new_tokens = 4
    workdir = tmp_path / "zero_shot"
    decoded = _zero_shot(config, str(workdir))
    claim = decoded["privacy"]["pretrained"]
    # A non-private decode config composes nothing, but the start still carries its ε.
    assert claim["dpnmt_export"] and claim["epsilon"] == EXPORT_EPSILON
    assert runs_table.start_epsilon(decoded["privacy"]) == EXPORT_EPSILON
    rows = runs_table.start_rows([str(workdir)], [], None)
    assert (
        rows[0]["epsilon_total"] == EXPORT_EPSILON and rows[0]["sampling"] == runs_table.ZERO_SHOT
    )
    # Declared disjoint, DP-trained: parallel composition, the larger ε (its own) stays.
    config.model.pretrained_data_disjoint = True
    decoded = _zero_shot(config, str(tmp_path / "zero_shot_disjoint"))
    assert decoded["privacy"]["pretrained"]["parallel"]
    assert runs_table.start_epsilon(decoded["privacy"]) == EXPORT_EPSILON


def test_a_zero_shot_start_declared_disjoint_but_trained_on_this_corpus_states_infinity(
    model_folder, tmp_path, monkeypatch
):
    """The review's case: a `:nonprivate` zero-shot decode never checked the declaration."""
    from dpnmt.sweeps import runs_table  # noqa: PLC0415

    _stop_before_tokenizing(monkeypatch)
    public_stage = _config(tmp_path, None, variant="nonprivate")  # Trained on this corpus.
    folder, _ = _export_trained_on(model_folder, tmp_path, public_stage, _record(False))
    monkeypatch.undo()
    config = _config(tmp_path, folder, "nonprivate")
    config.model.pretrained_data_disjoint = True  # Wrongly declared.
    config.eval.max_new_tokens = 4
    decoded = _zero_shot(config, str(tmp_path / "zero_shot"))
    assert decoded["privacy"]["pretrained_problems"]
    assert runs_table.start_epsilon(decoded["privacy"]) == math.inf


def test_a_zero_shot_decode_records_its_corpus_by_its_public_name(tmp_path):
    """Published: a `files:` corpus's folder by name, never the local path."""
    from dpnmt.evaluation import decode  # noqa: PLC0415

    config = _config(tmp_path, None, "nonprivate")
    assert str(tmp_path) in config.data.corpus  # files:<absolute folder>
    record = decode.zero_shot_claim(RunConfig.of(config), None)
    assert record["corpus"] == "files:corpus" and str(tmp_path) not in json.dumps(record)
