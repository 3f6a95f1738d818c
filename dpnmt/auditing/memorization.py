"""The memorization test end to end: duplicated texts into train, train, prompt, score, report.

As Ponomareva et al. (2022, Table 3): D training texts chosen at random are
repeated R times in the training split (`add_duplicates`, through the loop's
`corpus_transform` like the audit's canaries, so they count in N and in the
vocabulary); after training the model is prompted with part of each text of
three sets and its greedy output compared with the rest
(`dpnmt.evaluation.memorization`: EM, TA, MED):

- duplicated: the D repeated training texts;
- unique: U other training texts, seen once;
- held_out: H texts of the validation split, never trained on.

The prompt follows `data.objective`: a translation model gets the source (EM is
the rate at which it produces the training target verbatim), a prefix-LM model
the first half of the text's tokens (Python's round(n/2), clipped to
[1, n-1]; the rest is the target), a span-corruption model the text corrupted
as in training (a public function of the text and `data.objective_seed`: the
same spans it trained on; a held-out text's spans are drawn alike). Texts the
run's preprocessing drops (an empty side) or that leave nothing to predict
(fewer than 2 tokens) are not scored.

Publication: which texts were chosen (and the selection seed) and every
per-text score live in `private/`; `memorization.json` holds set-level rates.
A private run's rates on its training texts are statistics of private data
outside the guarantee (as its training loss): they stay in `private/` unless
`training_text_is_public` states the text is public (e.g. a public corpus
treated as private for the experiment); held-out rates stay there when the
validation split was carved from train.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets

import datasets
import jax.numpy as jnp
import numpy as np

from dpnmt import models
from dpnmt.config import RunConfig
from dpnmt.errors import InputError
from dpnmt.evaluation import decode as decode_lib
from dpnmt.evaluation import memorization as metrics
from dpnmt.training import loop, pieces
from dpnmt.training.privacy_report import PrivacyReport
from dpnmt.training.run_dir import RunDir, write_json

MEMORIZATION_FILE = "memorization.json"  # Published set-level rates.
SELECTION_FILE = "memorization_texts.json"  # Under private/: seed, options, chosen rows.
SCORES_FILE = "memorization_scores.json"  # Under private/: every set and text.
SETS = ("duplicated", "unique", "held_out")
PROMPTS = {
    "translation": "the source sentence; EM is the rate at which the target is produced verbatim",
    "prefix_lm": "the first round(n/2) of a text's n tokens; the target is the rest",
    "prefix_lm/training": "each text's prefix as the run split it (data.objective_seed); the "
    "target is the rest",
    "span_corruption": "the text span-corrupted as in training (data.objective_seed); "
    "the target is the sentinels and masked spans",
}


@dataclasses.dataclass(frozen=True)
class MemorizationOptions:
    """What the test inserts and scores.

    Attributes:
      duplicates: D training texts repeated (0: score a run as it is).
      repeats: R, the copies of each duplicated text in train (the original
        included), ≥ 2 when D > 0.
      unique: U training texts seen once, scored.
      held_out: H validation texts, scored.
      training_text_is_public: the training text is public, so a private run's
        rates on it may be published.
      prefix_prompt: a prefix-LM model's prompt: "half" (the first round(n/2)
        tokens) or "training" (each text's split as the run drew it: a run
        draws one split per text, so with a random split range "half" is not
        the example a duplicated text was trained on).
    """

    duplicates: int = 16
    repeats: int = 10
    unique: int = 64
    held_out: int = 64
    training_text_is_public: bool = False
    prefix_prompt: str = "half"

    def problems(self) -> list[str]:
        """Each bad option, naming its flag and the fix."""
        problems = [
            f"--{name}={getattr(self, name)} must be >= {low}"
            for name, low in (("duplicates", 0), ("unique", 1), ("held_out", 1), ("repeats", 1))
            if getattr(self, name) < low
        ]
        if self.prefix_prompt not in ("half", "training"):
            problems.append(f"--prefix_prompt={self.prefix_prompt!r} must be half or training")
        if self.duplicates and self.repeats < 2:
            problems.append(
                f"--repeats={self.repeats} leaves the {self.duplicates} duplicated texts "
                "unrepeated; use --repeats >= 2, or --duplicates=0"
            )
        return problems


def check_options(options: MemorizationOptions) -> None:
    """Raises one `InputError` naming every bad option (before anything is written)."""
    problems = options.problems()
    if problems:
        raise InputError("; ".join(problems) + ".")


@dataclasses.dataclass(frozen=True)
class Selection:
    """The chosen rows (SECRET: which private texts; kept in `private/`)."""

    seed: int
    num_train: int
    duplicated: tuple[int, ...]
    unique: tuple[int, ...]
    held_out: tuple[int, ...]


def choose_texts(
    num_train: int, num_validation: int, options: MemorizationOptions, seed: int
) -> Selection:
    """D + U distinct train rows and H validation rows, uniformly at random from `seed`.

    Raises:
      InputError: a split smaller than what is asked (the message holds no private count).
    """
    wanted = options.duplicates + options.unique
    if num_train < wanted:
        raise InputError(
            f"The train split has fewer texts than --duplicates + --unique = {wanted}; lower them."
        )
    if num_validation < options.held_out:
        raise InputError(
            f"The validation split has fewer texts than --held_out={options.held_out}; "
            "lower it (or raise data.max_eval_examples)."
        )
    rng = np.random.default_rng(seed)
    order = [int(i) for i in rng.permutation(num_train)[:wanted]]
    held = [int(i) for i in rng.permutation(num_validation)[: options.held_out]]
    return Selection(
        seed=seed,
        num_train=num_train,
        duplicated=tuple(sorted(order[: options.duplicates])),
        unique=tuple(sorted(order[options.duplicates :])),
        held_out=tuple(sorted(held)),
    )


def add_duplicates(selection: Selection, repeats: int):
    """A `corpus_transform` appending R - 1 more copies of each duplicated train row.

    Copies keep every column (a group column too: the text's owner repeats it).
    """

    def transform(corpus: datasets.DatasetDict) -> datasets.DatasetDict:
        train = corpus["train"]
        if len(train) != selection.num_train:
            raise InputError(
                "The train split changed since the memorization texts were chosen; use the "
                "same config, or a new --workdir."
            )
        copies = [i for i in selection.duplicated for _ in range(repeats - 1)]
        if copies:
            corpus["train"] = datasets.concatenate_datasets([train, train.select(copies)])
        return corpus

    return transform


def selection_for(
    run: RunConfig, workdir: str, options: MemorizationOptions, seed: int | None
) -> Selection:
    """The run's selection: reloaded from `private/`, or drawn (seed from the OS) and saved.

    Raises:
      InputError: other options than the saved ones, or duplicates asked of a run
        already trained without them.
    """
    run_dir = RunDir(workdir)
    path = run_dir.private_file(SELECTION_FILE)
    recorded = {k: v for k, v in dataclasses.asdict(options).items() if k in _SELECTION_OPTIONS}
    if os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)
        if saved["options"] != recorded:
            raise InputError(
                f"{workdir}'s memorization texts were chosen with other options "
                f"{saved['options']}; rerun with the same ones or use a new --workdir."
            )
        return Selection(
            **{
                k: tuple(v) if isinstance(v, list) else v
                for k, v in saved.items()
                if k != "options"
            }
        )
    if options.duplicates and run_dir.committed_step() is not None:
        raise InputError(
            f"{workdir} was trained without duplicated texts; score it as it is with "
            "--duplicates=0, or use a new --workdir."
        )
    corpus = pieces.load_corpus(run.data)
    seed = secrets.randbits(128) if seed is None else seed
    selection = choose_texts(len(corpus["train"]), len(corpus["validation"]), options, seed)
    run_dir.write_private_json(
        SELECTION_FILE, {"options": recorded, **dataclasses.asdict(selection)}
    )
    return selection


_SELECTION_OPTIONS = ("duplicates", "repeats", "unique", "held_out")


def prompt_objective(run: RunConfig, tokenizer, prefix_prompt: str):
    """(the RunConfig the prompts are tokenized with, its objective).

    Prefix LM with `prefix_prompt` "half": the first half of each text (no draw);
    otherwise the examples the run trained on, rebuilt from the public
    `data.objective_seed` (no `private/` read).
    """
    if run.data.objective == "prefix_lm" and prefix_prompt == "half":
        data = dataclasses.replace(run.data, prefix_min_fraction=0.5, prefix_max_fraction=0.5)
        run = dataclasses.replace(run, data=data)
    return run, pieces.make_objective(run.data, tokenizer)


def _generate(model, params, model_config, prompts, *, run: RunConfig, pad_id: int, eos: int):
    """Greedy output ids of each prompt, cut before eos (fixed-shape batches)."""
    gen = models.decoding.from_model_config(model_config, run.data.max_target_length, num_beams=1)
    fn = models.decoding.make_generate_fn(model, gen)
    size, length, out = run.eval.batch_size, run.data.max_source_length, []
    for start in range(0, len(prompts), size):
        rows = prompts[start : start + size]
        ids = np.full((size, length), pad_id, np.int32)
        mask = np.zeros((size, length), np.int32)
        ids[len(rows) :, 0], mask[len(rows) :, 0] = eos, 1  # Dummy rows: a lone eos.
        for r, row in enumerate(rows):
            ids[r, : len(row)], mask[r, : len(row)] = row, 1
        tokens, _ = fn(params, jnp.asarray(ids), jnp.asarray(mask))
        out += [metrics.until_eos(t, eos) for t in np.asarray(tokens)[: len(rows)].tolist()]
    return out


def score_sets(
    run: RunConfig, workdir: str, selection: Selection, prefix_prompt: str = "half"
) -> tuple[dict, list[dict]]:
    """Each set's EM/TA/MED and every scored text's row (private) for a trained run."""
    tokenizer, model, model_config, params, _, _ = decode_lib.load_trained(run, workdir)
    corpus = pieces.load_corpus(run.data)
    chosen = datasets.DatasetDict(
        duplicated=corpus["train"].select(selection.duplicated),
        unique=corpus["train"].select(selection.unique),
        held_out=corpus["validation"].select(selection.held_out),
    )
    prompt_run, objective = prompt_objective(run, tokenizer, prefix_prompt)
    tokenized, _ = pieces.tokenize_corpus(prompt_run, chosen, tokenizer, objective)
    sets, rows, eos = {}, [], tokenizer.eos_id
    for name in SETS:
        split = tokenized[name].with_format(None)
        kept = [r for r in split if len(r["labels"]) > 1]  # Labels end in eos.
        targets = [metrics.until_eos(r["labels"], eos) for r in kept]
        prompts = [r["input_ids"] for r in kept]
        generated = _generate(
            model, params, model_config, prompts, run=run, pad_id=tokenizer.pad_id, eos=eos
        )
        scores = [metrics.text_scores(g, t) for g, t in zip(generated, targets, strict=True)]
        indices = getattr(selection, name)
        texts = tokenizer.decode(generated) if generated else []
        for r, score, text in zip(kept, scores, texts, strict=True):
            rows.append(
                {"set": name, "row": indices[r["example_index"]], **score, "generated": text}
            )
        sets[name] = {"texts": len(kept), **(metrics.set_scores(scores) if scores else {})}
    return sets, rows


def published_sets(sets: dict, privacy: PrivacyReport, options: MemorizationOptions) -> dict:
    """The sets' rates that may be published, and why the others stay in `private/`."""
    shown, withheld = {}, {}
    for name, scores in sets.items():
        if name != "held_out" and privacy.private and not options.training_text_is_public:
            withheld[name] = (
                "a private run's rates on its training text are outside the guarantee: in "
                f"private/{SCORES_FILE} (--training_text_is_public if the text is public)"
            )
        elif name == "held_out" and privacy.validation_is_private:
            withheld[name] = f"validation carved from train: in private/{SCORES_FILE}"
        else:
            shown[name] = scores
    return {"sets": shown, "withheld": withheld}


def _prompt_kind(run: RunConfig, options: MemorizationOptions) -> str:
    if run.data.objective == "prefix_lm" and options.prefix_prompt == "training":
        return "prefix_lm/training"
    return run.data.objective


def run_memorization(
    run: RunConfig,
    workdir: str,
    options: MemorizationOptions,
    *,
    selection_seed: int | None = None,
) -> dict:
    """Chooses and duplicates texts, trains (or resumes), scores and writes the report.

    Args:
      run: the run's config (`training.preflight.read_config`).
      workdir: the run's folder (a training workdir plus the test's files).
      options: the test's options.
      selection_seed: fixed seed for tests; None draws 128 bits from the OS.

    Returns:
      The report written to `workdir/memorization.json` (what may be published).
    """
    check_options(options)
    selection = selection_for(run, workdir, options, selection_seed)
    results = RunDir(workdir).read_results()
    if not (results and results.get("finished")):
        transform = add_duplicates(selection, options.repeats)
        results = loop.train_and_evaluate(run, workdir, corpus_transform=transform)
    privacy = PrivacyReport.from_json(results["privacy"])
    sets, rows = score_sets(run, workdir, selection, options.prefix_prompt)
    report = {
        "objective": run.data.objective,
        "prompt": PROMPTS[_prompt_kind(run, options)],
        "decoding": "greedy, at most data.max_target_length tokens",
        "options": dataclasses.asdict(options),
        **published_sets(sets, privacy, options),
        "privacy": {
            "private": privacy.private,
            "total_epsilon": privacy.total_epsilon,
            "total_delta": privacy.total_delta,
            "duplicates_note": "each duplicated text is R examples: DP-SGD's ε per example "
            "covers it as a group of R (group privacy)",
        },
        "metrics": "token ids, eos excluded; per-text means: exact_match (output == target), "
        "token_accuracy (target positions reproduced in place), edit_distance (Levenshtein "
        "/ target length)",
    }
    RunDir(workdir).write_private_json(SCORES_FILE, {"sets": sets, "texts": rows})
    write_json(os.path.join(workdir, MEMORIZATION_FILE), report)
    for name, scores in report["sets"].items():  # Published rates only, as the log is.
        if "exact_match" in scores:
            logging.info(
                "Memorization, %s: EM %.3f, TA %.3f, MED %.3f",
                name,
                scores["exact_match"],
                scores["token_accuracy"],
                scores["edit_distance"],
            )
    return report
