"""`dpnmt.translate` decodes as `dpnmt.decode` does: the same options, one check, recorded defaults.

The decoding flags (`--num_beams`, `--length_penalty`, `--no_repeat_ngram_size`)
are defined once (`dpnmt.decoding_flags`) and checked once (`EvalConfig.problems`);
left out, they are the run's `eval` settings or the export's `dpnmt.json`.
"""

import os
import subprocess
import sys

import pytest

from dpnmt import cli, release
from dpnmt.config import EvalConfig
from dpnmt.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny_translator(decoding: EvalConfig) -> release.Translator:
    from dpnmt import models

    model_config = models.T5Config(vocab_size=8, d_model=4, d_kv=2, d_ff=4, num_layers=1)
    return release.Translator(None, None, model_config, None, "", 16, decoding=decoding)


@pytest.fixture
def sent(monkeypatch):
    """What `translate_lines` hands to `evaluation.translate`: (sources, gen, batch_size)."""
    calls = []

    def fake_translate(model, params, tokenizer, sources, *, gen, batch_size, **kwargs):
        calls.append((list(sources), gen, batch_size))
        return [s.upper() for s in sources]

    monkeypatch.setattr("dpnmt.evaluation.translate", fake_translate)
    return calls


def test_translate_lines_decodes_with_the_recorded_settings(sent):
    recorded = EvalConfig(num_beams=4, length_penalty=0.6, no_repeat_ngram_size=6, max_new_tokens=9)
    assert release.translate_lines(_tiny_translator(recorded), ["a", "", "b"]) == ["A", "", "B"]
    ((_, gen, batch_size),) = sent
    assert (gen.num_beams, gen.length_penalty, gen.no_repeat_ngram_size) == (4, 0.6, 6)
    assert gen.max_new_tokens == 9 and batch_size == recorded.batch_size


def test_translate_lines_overrides_only_what_it_is_given(sent):
    recorded = EvalConfig(num_beams=4, no_repeat_ngram_size=6)
    release.translate_lines(
        _tiny_translator(recorded), ["a"], num_beams=1, no_repeat_ngram_size=0, batch_size=2
    )
    ((_, gen, batch_size),) = sent
    assert (gen.num_beams, gen.no_repeat_ngram_size, batch_size) == (1, 0, 2)
    assert gen.max_new_tokens == recorded.max_new_tokens


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"num_beams": 0}, "num_beams=0 must be >= 1"),
        ({"length_penalty": float("nan")}, "length_penalty=nan must be finite"),
        ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size=-1 must be >= 0"),
        ({"max_new_tokens": 0}, "max_new_tokens=0 must be >= 1"),
        ({"batch_size": 0}, "batch_size=0 must be >= 1"),
    ],
)
def test_a_bad_decoding_setting_is_refused_before_translating(sent, override, message):
    with pytest.raises(ConfigError, match=message):
        release.translate_lines(_tiny_translator(EvalConfig()), ["a"], **override)
    assert not sent


# The apps' bad decoding flags: one line naming the flag and what it must be, nothing written.
BAD_FLAGS = [
    ("--num_beams=0", "--num_beams=0 must be >= 1 (1: greedy)."),
    ("--num_beams=-3", "--num_beams=-3 must be >= 1 (1: greedy)."),
    ("--length_penalty=nan", "--length_penalty=nan must be finite"),
    ("--length_penalty=inf", "--length_penalty=inf must be finite"),
    ("--no_repeat_ngram_size=-1", "--no_repeat_ngram_size=-1 must be >= 0 (0: no n-gram ban)."),
]
TRANSLATE_ONLY = [
    ("--max_length=0", "--max_length=0 must be >= 1."),
    ("--batch_size=0", "--batch_size=0 must be >= 1."),
]


@pytest.mark.parametrize(
    ("app", "flag", "message"),
    [("dpnmt.translate", *case) for case in BAD_FLAGS + TRANSLATE_ONLY]
    + [("dpnmt.decode", *case) for case in BAD_FLAGS],
)
def test_a_bad_decoding_flag_is_one_line_and_writes_nothing(tmp_path, app, flag, message):
    out = tmp_path / "out.txt"
    result = subprocess.run(
        [sys.executable, "-m", app, f"--workdir={tmp_path}", f"--output={out}", flag]
        if app == "dpnmt.translate"
        else [sys.executable, "-m", app, f"--workdir={tmp_path}", flag],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=REPO),
        cwd=REPO,
        input="Ein Hund.\n",
        timeout=300,
    )
    assert result.returncode == cli.USAGE_EXIT_CODE, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"{app}: ") and message in line, line
    assert result.stdout == "" and not list(tmp_path.iterdir())


def test_the_export_records_its_decoding_for_transformers_and_for_translate(tmp_path):
    import json

    import transformers

    from dpnmt.models import export
    from tests.tiny_export import write_tiny_export

    folder = write_tiny_export(tmp_path)
    old = release.load_translator(model_dir=str(folder))  # No dpnmt.json: the defaults.
    assert old.decoding == EvalConfig()
    recorded = EvalConfig(
        num_beams=4, length_penalty=0.6, no_repeat_ngram_size=6, max_new_tokens=40
    )
    export.save_pretrained(
        old.params, old.model_config, str(folder), generation=recorded.decoding()
    )
    (folder / release.SETTINGS_FILE).write_text(json.dumps(recorded.decoding()))
    # transformers' generate defaults to them (not its 20 tokens, no ban).
    gen = transformers.GenerationConfig.from_pretrained(str(folder))
    assert (gen.max_new_tokens, gen.num_beams, gen.no_repeat_ngram_size) == (40, 4, 6)
    assert gen.length_penalty == 0.6
    # And dpnmt.translate reads them from dpnmt.json.
    assert release.load_translator(model_dir=str(folder)).decoding == recorded
    # Greedy: transformers refuses a length penalty without beams, so it is left out.
    greedy = EvalConfig(length_penalty=0.6, max_new_tokens=40).decoding()
    export.save_pretrained(old.params, old.model_config, str(folder), generation=greedy)
    gen = transformers.GenerationConfig.from_pretrained(str(folder))
    assert (gen.max_new_tokens, gen.num_beams, gen.length_penalty) == (40, 1, None)
