"""A trained run -> a self-contained transformers folder, and back to a translator.

`export_run` writes what `python -m dpnmt.export` promises: the model
(`config.json`, `model.safetensors`, `generation_config.json` with the run's
decoding settings, so transformers' `generate` decodes as dpnmt does), the
tokenizer (`AutoTokenizer` loads it), `dpnmt.json` (the public decoding
settings: source prefix, languages, lengths, beams, length penalty, n-gram ban;
and under "privacy" the run's privacy report, which
a run fine-tuning the export reads: `training.pretrained_privacy`) and the
model card `README.md`. It reads the run's
`config.json`, `results.json`, vocabulary and latest checkpoint, never `private/`.
The folder is built beside `--out` and renamed into place (`atomic_file.folder_built_beside`):
a kill leaves no model without its `dpnmt.json`, and the transformers `config.json` is
marked (`models.export_record`) so that a copy left without it is refused as a start and by
`load_translator`.
`load_translator` opens either a run or such a folder for `dpnmt.translate`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

from dpnmt import atomic_file, fault_points, manifest, model_card
from dpnmt.config import DataConfig, EvalConfig, ModelConfig
from dpnmt.config.sections import DECODING_FIELDS
from dpnmt.data import corpus_record, hf_tokenizer, text_objective, tokenizers
from dpnmt.data.languages import mbart_codes, parse_pair
from dpnmt.data.preprocess import family_source_prefix
from dpnmt.errors import ConfigError, InputError, MissingInputError, ModelUnavailableError
from dpnmt.evaluation import decode as decode_lib
from dpnmt.models import export_record
from dpnmt.training import ledger, ledger_check, pieces, pretrained_privacy
from dpnmt.training.privacy_report import privacy_report
from dpnmt.training.run_dir import CHECKPOINT_DIR, CONFIG_FILE, RunDir, write_json

SETTINGS_FILE = pretrained_privacy.SETTINGS_FILE
CARD_FILE = "README.md"


def require_trained_run(workdir: str) -> None:
    """Raises one clear error unless `workdir` holds a finished or checkpointed run."""
    if not os.path.isdir(workdir):
        raise MissingInputError(
            f"--workdir={workdir}: no such folder; give a training run's folder "
            "(the --workdir given to python -m dpnmt.train)."
        )
    config_path = RunDir(workdir).config_path
    checkpoints = os.path.join(workdir, CHECKPOINT_DIR)
    has_step = os.path.isdir(checkpoints) and any(
        name.isdigit() for name in os.listdir(checkpoints)
    )
    if not os.path.isfile(config_path) or not has_step:
        raise MissingInputError(
            f"{workdir} holds no finished or checkpointed training run (needs "
            f"{CONFIG_FILE} and a step in {CHECKPOINT_DIR}/): train first "
            "with python -m dpnmt.train, or pass the run's folder."
        )


@dataclasses.dataclass(frozen=True)
class Translator:
    """What translating text needs: model, params, tokenizer and public settings.

    Attributes:
        model: The Flax module.
        params: Its parameters.
        model_config: Its T5Config / MBartConfig (token ids for generation).
        tokenizer: Encodes sources, decodes outputs.
        source_prefix: Text put before every source (T5's task prefix, or "").
        max_source_length: Source tokens per sentence (longer ones are truncated).
        decoding: The recorded decoding settings (`EvalConfig.decoding()`, batch size):
            what `translate_lines` uses unless told otherwise.
    """

    model: Any
    params: Any
    model_config: Any
    tokenizer: tokenizers.Tokenizer
    source_prefix: str
    max_source_length: int
    decoding: EvalConfig = EvalConfig()


def _settings(data: DataConfig, model: ModelConfig, eval_config: EvalConfig) -> dict[str, Any]:
    """The public decoding settings of a run, as written to `dpnmt.json`."""
    pair = parse_pair(data.pair)
    src_lang, tgt_lang = mbart_codes(pair) if model.family == "mbart" else (None, None)
    return {
        "pair": data.pair,
        "family": model.family,
        "source_prefix": family_source_prefix(model.family, pair, model.source_prefix),
        "src_lang": src_lang,
        "tgt_lang": tgt_lang,
        "max_source_length": data.max_source_length,
        **eval_config.decoding(),
    }


def _recorded_decoding(settings: dict[str, Any]) -> EvalConfig:
    """An export's decoding settings; those an older `dpnmt.json` lacks keep their defaults."""
    return EvalConfig(**{name: settings[name] for name in DECODING_FIELDS if name in settings})


def load_translator(*, workdir: str | None = None, model_dir: str | None = None) -> Translator:
    """A run's latest checkpoint (`workdir`) or an exported folder (`model_dir`).

    Raises:
        ConfigError: Neither or both given.
        MissingInputError: `workdir` is no folder or holds no finished or checkpointed
            run; `model_dir` looks like a path and is no folder, or is a dpnmt export
            without its `dpnmt.json` (`models.export_record`).
        ModelUnavailableError: `model_dir` is no folder and not downloadable as a hub id.
    """
    if (workdir is None) == (model_dir is None):
        raise ConfigError("Give exactly one of --workdir (a training run) or --model (an export).")
    if workdir is not None:
        require_trained_run(workdir)
        run = decode_lib.load_run_config(workdir)
        tokenizer, model, model_config, params, _, _ = decode_lib.load_trained(run, workdir)
        settings = _settings(run.data, run.model, run.eval)
        decoding = run.eval
    else:
        lost = export_record.problem(model_dir, "--model")
        if lost is not None:  # Served silently, its guarantee would be unknown.
            raise MissingInputError(lost)
        settings = {}
        path = os.path.join(model_dir, SETTINGS_FILE)
        if os.path.isfile(path):
            with open(path) as f:
                settings = json.load(f)
        model, params, hf = _load_export(model_dir)
        if hf is None:
            raise FileNotFoundError(f"{model_dir} has no tokenizer files; export it again.")
        tokenizer = tokenizers.HFTokenizer(
            hf, src_lang=settings.get("src_lang"), tgt_lang=settings.get("tgt_lang")
        )
        model_config = model.config
        decoding = _recorded_decoding(settings)
    return Translator(
        model=model,
        params=params,
        model_config=model_config,
        tokenizer=tokenizer,
        source_prefix=settings.get("source_prefix") or "",
        max_source_length=settings.get("max_source_length") or 512,
        decoding=decoding,
    )


def _load_export(model_dir: str):
    """`models.load_pretrained(model_dir)`; a missing folder or unreachable hub id in one line."""
    from dpnmt import models
    from dpnmt.models import hub
    from dpnmt.models.checks import looks_local

    if not os.path.isdir(model_dir) and looks_local(model_dir):
        raise MissingInputError(
            f"--model={model_dir}: no such folder; give a folder written by "
            "python -m dpnmt.export (or a training run's folder with --workdir)."
        )
    unavailable = ModelUnavailableError(
        f"--model={model_dir}: no such local folder, and as a Hugging Face hub id it could "
        "not be downloaded (offline, or no such model). Give the folder written by "
        "python -m dpnmt.export, or download the model where there is internet."
    )
    # One short request (or the cache) first: a mistyped id then costs no download retries.
    if not os.path.isdir(model_dir) and hub.availability_problem(model_dir, needs_tokenizer=True):
        raise unavailable
    try:
        return models.load_pretrained(model_dir)
    except OSError as error:
        if os.path.isdir(model_dir):
            raise
        raise unavailable from error


def read_lines(path: str | None) -> list[str]:
    """The lines of `path` (stdin when None) as UTF-8; a missing or non-UTF-8 file in one line.

    Raises:
        MissingInputError: No file at `path`.
        InputError: The text is not UTF-8.
    """
    name = "stdin" if path is None else f"--input={path}"
    try:
        if path is None:
            return sys.stdin.buffer.read().decode("utf-8").splitlines()
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        raise MissingInputError(
            f"{name}: no such file; give a text file with one sentence a line, or pipe the text "
            "on stdin (leave out --input)."
        ) from None
    except UnicodeDecodeError as error:
        raise InputError(
            f"{name} is not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset "
            f"{error.start:,}); convert it first, e.g. "
            "iconv -f latin1 -t utf-8 in.txt > in.utf8.txt"
        ) from None


def empty_translation_warning(lines: list[str], translations: list[str]) -> str | None:
    """A warning when non-blank lines were translated to empty text, else None.

    Args:
        lines: [num_lines] sources.
        translations: [num_lines] their translations (`translate_lines`).
    """
    asked = [i for i, line in enumerate(lines) if line.strip()]
    empty = sum(1 for i in asked if not translations[i].strip())
    if not empty:
        return None
    return (
        f"{empty:,} of {len(asked):,} non-blank lines were translated to empty text: the model "
        "most likely is undertrained (too few lots, or too much noise for its data) or its "
        "vocabulary is too small for this text (check the run's vocabulary size and test BLEU)."
    )


def _read_results(workdir: str) -> dict | None:
    path = RunDir(workdir).results_path
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def export_settings(run, privacy: dict[str, Any]) -> dict[str, Any]:
    """An export's `dpnmt.json`: decoding settings, privacy record, training corpora, ledger.

    The ledger (`training.ledger`) is the starting export's stages, passed on
    unchanged, then this run's: its corpora and the events that spent privacy
    on its data (none but "no_guarantee" for a non-private run).

    Args:
        run: the run's `RunConfig`.
        privacy: its results.json "privacy" object (as loaded: inf as "inf").

    Raises:
        LedgerError: the record's total is below its own DP-SGD ε recomputed.
    """
    corpora = corpus_record.training_corpora(run)
    stages = ledger_check.stages_of_record(privacy, corpora)  # A later start checks it again.
    # The privacy record travels with the model: a run fine-tuning it composes it.
    # And its training corpora: a run declaring its data disjoint is refused if they are its own.
    return {
        **_settings(run.data, run.model, run.eval),
        pretrained_privacy.PRIVACY_KEY: privacy,
        corpus_record.KEY: corpora,
        ledger.KEY: [stage.to_json() for stage in stages],
    }


def export_run(workdir: str, out_dir: str) -> str:
    """Writes the run's model, tokenizer, settings and model card into `out_dir`.

    Args:
        workdir: A training run's folder with a checkpoint (finished or not).
        out_dir: A new or empty folder.

    Returns:
        The model card's text.

    Raises:
        FileNotFoundError: No finished or checkpointed run in `workdir`.
        FileExistsError: `out_dir` is not empty.
    """
    from dpnmt.models import export

    require_trained_run(workdir)
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        raise FileExistsError(f"--out={out_dir} is not empty; give a new or empty folder.")
    run = decode_lib.load_run_config(workdir)
    tokenizer, vocabulary = pieces.build_tokenizer(run, None, workdir, noise_seed=None, learn=False)
    _, _, model_config, params, plan, steps_done = decode_lib.load_trained(run, workdir)
    results = _read_results(workdir)
    if results is not None and results.get("finished") and "privacy" in results:
        privacy = results["privacy"]
    else:  # Checkpoint only: the report for the steps it holds.
        carved = pieces.validation_is_carved_from_train(pieces.load_corpus(run.data))
        privacy = privacy_report(
            plan,
            steps_done,
            vocabulary,
            validation_is_private=carved,
            pretrained=pretrained_privacy.recorded_claim(run, workdir),
            example=text_objective.example_unit(run.data),
        ).to_json()
    settings = export_settings(run, privacy)
    card = model_card.render(run, privacy, results, steps_done=steps_done)
    # Built beside --out and renamed into place: a kill leaves no model without its record.
    with atomic_file.folder_built_beside(out_dir) as building:
        export.save_pretrained(params, model_config, building, generation=run.eval.decoding())
        export_record.mark(building)  # Its config.json says a dpnmt.json belongs beside it.
        hf_tokenizer.save_tokenizer(tokenizer, building)
        fault_points.reached(fault_points.EXPORT_WEIGHTS_WRITTEN)
        write_json(os.path.join(building, SETTINGS_FILE), settings)
        atomic_file.write_atomic(os.path.join(building, CARD_FILE), card)
        manifest.write(building)  # Last: every file's sha256 (SHA256SUMS), checked on load.
    return card


def translate_lines(
    translator: Translator,
    lines: list[str],
    *,
    show_progress: bool | None = None,
    **decoding: int | float,
) -> list[str]:
    """One translation per line; an empty (or blank) line gives an empty line.

    Args:
        translator: From `load_translator`.
        lines: [num_lines] source sentences.
        show_progress: tqdm bar (None: when there is more than one batch).
        **decoding: `EvalConfig` fields that replace the translator's recorded
            settings: num_beams (1: greedy), length_penalty, no_repeat_ngram_size,
            max_new_tokens (generated tokens per sentence), batch_size (sentences
            per generate call).

    Returns:
        [num_lines] translations, each on one line (line breaks joined by spaces).

    Raises:
        ConfigError: A decoding setting out of its range (before anything is translated).
    """
    from dpnmt import evaluation
    from dpnmt.models import decoding as decoding_lib

    settings = dataclasses.replace(translator.decoding, **decoding)
    problems = settings.problems()
    if problems:
        raise ConfigError(" ".join(problems))
    gen = decoding_lib.from_model_config(translator.model_config, **settings.decoding())
    keep = [i for i, line in enumerate(lines) if line.strip()]
    outputs = evaluation.translate(
        translator.model,
        translator.params,
        translator.tokenizer,
        [lines[i] for i in keep],
        gen=gen,
        batch_size=settings.batch_size,
        max_source_length=translator.max_source_length,
        source_prefix=translator.source_prefix,
        show_progress=show_progress,
    )
    translations = [""] * len(lines)
    for index, text in zip(keep, outputs, strict=True):
        translations[index] = " ".join(text.splitlines())
    return translations
