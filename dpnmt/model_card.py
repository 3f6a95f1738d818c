"""The model card (README.md) of an exported model: privacy report, data, scores.

Pure: it renders what the run published (its config and `results.json`, or the
checkpoint's privacy report for an unfinished run) and nothing from `private/`;
local paths in the config (corpus folder, base model) appear as names only.
Keys are read defensively: whatever of a known key is present is printed, and
keys it does not know are listed as they are, so a newer `results.json` is
never silently cut.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from dpnmt.config import ModelConfig, RunConfig
from dpnmt.public_names import public_corpus, public_name

# Privacy-report keys this card explains; any others are printed after them.
_PRIVACY_KEYS = {
    "private": "DP-SGD applied",
    "total_epsilon": "total ε (DP-SGD + vocabulary + a composed pretrained export; "
    "with a disjoint DP-trained one, the larger of the two)",
    "total_delta": "total δ",
    "dp_sgd_epsilon": "DP-SGD ε",
    "dp_sgd_delta": "DP-SGD δ",
    "bound": "bound ε comes from",
    "sampling": "lot sampling",
    "epsilon_if_poisson_NOT_A_GUARANTEE": "ε if lots had been Poisson (NOT a guarantee)",
    "noise_multiplier": "noise multiplier σ",
    "l2_clip": "clipping norm C",
    "expected_lot_size": "expected lot size L",
    "sampling_rate": "sampling rate q",
    "dataset_size": "training pairs N",
    "steps_done": "steps done",
    "steps_planned": "steps planned",
    "composition": "composition",
    "example": "one training example (the unit ε is stated for)",
    "joint_dp_sgd": "both stages' DP-SGD in one accountant",
    "validation_is_private": "validation carved from the private training data (NOT covered)",
    "assumed_public": "assumed public",
}
# dp.unit="group" (results.json "privacy_unit"): N and L count groups, not pairs.
# A pre-training objective's report (an "example" other than a pair): N counts non-empty texts.
_TEXT_LABELS = {"dataset_size": "training texts N"}
_ONE_PAIR = "one sentence pair"
_GROUP_LABELS = {
    "dataset_size": "groups N_groups",
    "expected_lot_size": "expected groups per lot L",
    "l2_clip": "clipping norm C (of one group's summed gradient)",
}
# Never printed, even if a future results.json carried them.
_SECRET_KEYS = ("seed", "noise_seed", "lot_sizes", "train_loss")


def _value(value: Any) -> str:
    if isinstance(value, float):
        return "∞" if math.isinf(value) else f"{value:.6g}"
    if isinstance(value, (dict, list, tuple)):
        return "`" + json.dumps(value, default=str, ensure_ascii=False) + "`"
    return str(value)


def _is_secret(key: str) -> bool:
    return any(secret in key for secret in _SECRET_KEYS)


def group_unit(privacy: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The report's `privacy_unit` record when one whole group is the unit (dp.unit="group")."""
    unit = privacy.get("privacy_unit")
    if isinstance(unit, Mapping) and unit.get("unit") == "group":
        return unit
    return None


def _covers(privacy: Mapping[str, Any]) -> tuple[str, str, str]:
    """(the neighbour, the clipping, the counts assumed public) of the report's privacy unit."""
    unit = group_unit(privacy)
    example = privacy.get("example")
    if unit is None and isinstance(example, str) and example != _ONE_PAIR:
        return (f"{example} of the training data", "per-example clipping", "N and other counts")
    if unit is None:
        return (
            "one training sentence pair",
            "per-example clipping",
            "the training-set size N and other counts",
        )
    cap = unit.get("group_cap", "k")
    return (
        "one whole group (a user or document: all its sentence pairs)",
        f"per-group clipping, each group capped at k = {cap} pairs per lot",
        "the number of groups N_groups, the cap k and other counts",
    )


def _privacy_section(privacy: Mapping[str, Any]) -> list[str]:
    texts = privacy.get("example") not in (None, _ONE_PAIR)
    labels = _PRIVACY_KEYS | (_TEXT_LABELS if texts else {})
    labels |= _GROUP_LABELS if group_unit(privacy) is not None else {}
    neighbour, clipping, counts = _covers(privacy)
    lines = ["## Privacy", ""]
    if not privacy.get("private", False):
        lines += [
            "**This model was trained WITHOUT differential privacy**: no privacy guarantee "
            "covers its training data.",
            "",
        ]
    lines += ["| | |", "|---|---|"]
    for key, label in labels.items():
        if key in privacy:
            lines.append(f"| {label} (`{key}`) | {_value(privacy[key])} |")
    vocabulary = privacy.get("vocabulary") or {}
    for key, value in vocabulary.items():
        lines.append(f"| vocabulary {key} | {_value(value)} |")
    pretrained = privacy.get("pretrained") or {}
    for key, value in pretrained.items():  # The starting model's own record last.
        if key != "record":
            lines.append(f"| pretrained model {key} | {_value(value)} |")
    if pretrained.get("record") is not None:
        lines.append(f"| pretrained model's own privacy record | {_value(pretrained['record'])} |")
    for key, value in privacy.items():
        if (
            key not in _PRIVACY_KEYS
            and key not in ("vocabulary", "pretrained", "group_privacy")
            and not _is_secret(key)
        ):
            lines.append(f"| `{key}` | {_value(value)} |")
    bound = privacy.get("bound", "")
    lines += [
        "",
        f"**What the guarantee covers.** (ε, δ)-DP for adding or removing {neighbour}, "
        f"for the model's weights: DP-SGD ({clipping}, Gaussian "
        f"noise once per lot, the accountant's ε for the sampling that ran: {bound or 'see above'}"
        "), composed with the vocabulary's ε when it was learnt with DP-SentencePiece. "
        "A vocabulary learnt from the private data without DP voids it (total ε = ∞).",
        "",
        "**What it does not cover.** The validation data (it drives evaluation and early "
        "stopping; publish only validation data you may publish); "
        f"{counts}, assumed public; the hyper-parameter search (each configuration "
        "tried spends privacy that this ε does not count); a pretrained starting model's own "
        "training data, unless its ε is composed above (a dpnmt export whose data may overlap "
        "this run's, or one trained with DP on data declared disjoint: the larger ε). "
        "Shuffled lots give only the no-amplification bound; a figure marked "
        "NOT_A_GUARANTEE is no guarantee.",
    ]
    group = privacy.get("group_privacy")
    if isinstance(group, Mapping) and group.get("note"):
        lines += ["", f"**A person with many sentences.** {group['note']}"]
    unit = group_unit(privacy)
    if unit is not None and unit.get("note"):
        lines += ["", f"**The privacy unit.** {unit['note']}"]
    pretrained = privacy.get("pretrained") or {}
    if pretrained.get("composed") and isinstance(pretrained.get("record"), Mapping):
        theirs = pretrained["record"].get("example") or _ONE_PAIR
        ours = privacy.get("example") or _ONE_PAIR
        joint = "one dp_accounting event" in str(privacy.get("composition"))
        how = "both DP-SGD runs in one accountant" if joint else "the sum of the two totals"
        lines += [
            "",
            f"**Two private stages.** The total ε ({how}) composes the pretrained export's "
            f"own guarantee, per {theirs}, with this run's, per {ours}: it bounds one person "
            "with at most one example in each stage's training data.",
        ]
    if pretrained.get("parallel"):
        theirs = (pretrained.get("record") or {}).get("example") or _ONE_PAIR
        ours = privacy.get("example") or _ONE_PAIR
        lines += [
            "",
            "**Two private stages, disjoint data (declared).** The total ε is the larger of "
            f"the pretrained export's own (ε = {_value(pretrained.get('epsilon'))}, per "
            f"{theirs}) and this run's (per {ours}): parallel composition over disjoint data "
            "(model.pretrained_data_disjoint=True, the user's declaration): each person's data "
            "are in one stage's training set only.",
        ]
    elif pretrained.get("dpnmt_export") and pretrained.get("declared_disjoint"):
        lines += ["", _UNGUARDED_EXPORT.format(_trained(pretrained.get("record")))]
    return lines


_UNGUARDED_EXPORT = (
    "**A starting model without a guarantee.** The pretrained export {}: its training data have "
    "no privacy guarantee here. They were declared public or disjoint from this run's "
    "(model.pretrained_data_disjoint=True, the user's declaration); the total ε covers this "
    "run's training data only."
)


def _trained(record: Any) -> str:
    if not isinstance(record, Mapping):
        return "records no privacy guarantee"
    if record.get("private") is True:  # A record from before parallel composition.
        return "was trained with DP, but this report (older than parallel composition) omits it"
    return "was trained without DP (its own record is not private)"


def _scores_section(results: Mapping[str, Any] | None) -> list[str]:
    lines = ["## Scores", ""]
    if not results or not results.get("finished"):
        return lines + ["The run is not finished: no test scores yet (checkpoint export)."]
    for split in ("test", "validation"):
        scores = results.get(split)
        if not isinstance(scores, Mapping):
            continue
        lines.append(f"**{split}**")
        lines.append("")
        for key, value in scores.items():
            if not _is_secret(key) and not isinstance(value, Mapping):
                lines.append(f"- {key}: {_value(value)}")
        bertscore = scores.get("bertscore")
        if isinstance(bertscore, Mapping):
            lines.append(f"- bertscore: {_value(dict(bertscore))}")
        lines.append("")
    note = results.get("validation_note")
    if note:
        lines.append(f"_{note}_")
    return lines


def _objective_lines(data, privacy: Mapping[str, Any]) -> list[str]:
    """The pre-training objective and its unit (`data.objective`); none for translation."""
    if data.objective == "translation":
        return []
    how = {
        "span_corruption": f"T5 span corruption (noise density {data.noise_density}, mean "
        f"span {data.mean_span_length} tokens): the targets are masked spans",
        "prefix_lm": f"prefix LM (split in [{data.prefix_min_fraction}, "
        f"{data.prefix_max_fraction}] of the length): the target is the continuation",
    }[data.objective]
    return [
        f"- objective: {data.objective}, {how}; on {data.text_language} text only "
        "(monolingual: not a translation model until fine-tuned)",
        f"- unit of privacy: {privacy.get('example') or 'one text'}; N counts the non-empty "
        f"{data.text_language} texts (empty lines dropped before sampling)",
    ]


def _finetuning(model: ModelConfig) -> str:
    """Which parameters DP-SGD trained (`model.finetune`, `model.trainable`), as exported."""
    mode = model.finetune
    rank = model.lora_rank or 0
    alpha = model.lora_alpha
    adapters = (
        f"LoRA adapters (rank {rank}, alpha {alpha if alpha is not None else rank}, "
        f"on {model.lora_targets}), merged into the exported weights (W + (alpha/r)·A·B)"
    )
    if mode == "lora":
        return f"{adapters} only; the base weights were frozen"
    if mode == "bias":
        return "bias terms only; every other weight frozen at the base model's"
    trained = (
        f"the parameters whose path matches `{model.trainable}`; the others frozen "
        "at the base model's"
        if model.trainable
        else "all parameters"
    )
    return f"{trained}, and {adapters}" if rank else trained


def _vocabulary_kind(run: RunConfig, privacy: Mapping[str, Any]) -> str:
    """The vocabulary kind used: the report's, else `tokenizer.kind` with "auto" resolved."""
    kind = (privacy.get("vocabulary") or {}).get("kind")
    if kind:
        return kind
    if run.tokenizer.kind != "auto":
        return run.tokenizer.kind
    return run.tokenizer_kind  # "auto" resolved: never refused.


def render(
    run: RunConfig,
    privacy: Mapping[str, Any],
    results: Mapping[str, Any] | None,
    *,
    steps_done: int,
) -> str:
    """The model card's Markdown.

    Args:
        run: The run's resolved config (`config.json`: `decode.load_run_config`).
        privacy: The privacy report (`results.json["privacy"]`, or
            `PrivacyReport.to_json()` of the checkpoint for an unfinished run).
        results: The run's `results.json`, or None before it is finished.
        steps_done: DP-SGD steps of the exported parameters.

    Returns:
        README.md text.
    """
    data, model = run.data, run.model
    pair = data.pair
    # Names, not local paths (`dpnmt.public_names`).
    base = model.name_or_path
    base = public_name(base) if base else "none (trained from scratch)"
    epsilon = privacy.get("total_epsilon")
    title = f"# dpnmt translation model ({pair})"
    if data.objective != "translation":
        title = f"# dpnmt pre-trained model ({data.objective} on {data.text_language} text)"
    summary = (
        f"Trained with dpnmt (JAX/Flax DP-SGD) and exported to "
        f"transformers. Base model: {base}. Steps: {steps_done}. "
        + (
            f"Privacy: ε = {_value(epsilon)}, δ = {_value(privacy.get('total_delta'))}."
            if privacy.get("private")
            else "Not differentially private."
        )
    )
    lines = [title, "", summary, ""]
    lines += _privacy_section(privacy)
    lines += [
        "",
        "## Data",
        "",
        f"- corpus: {public_corpus(data.corpus)}, direction {pair}",
        f"- max source / target tokens: {data.max_source_length} / {data.max_target_length}",
        f"- vocabulary: {_vocabulary_kind(run, privacy)}",
        *_objective_lines(data, privacy),
        f"- trained parameters: {_finetuning(model)}",
    ]
    if data.max_train_examples is not None:
        lines.append(f"- first {data.max_train_examples} training pairs kept")
    lines += [""] + _scores_section(results)
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        'tokenizer = AutoTokenizer.from_pretrained("THIS_DIR")',
        'model = AutoModelForSeq2SeqLM.from_pretrained("THIS_DIR")',
        "ids = tokenizer([PREFIX + sentence], return_tensors='pt')",
        "print(tokenizer.batch_decode(model.generate(**ids), skip_special_tokens=True))",
        "```",
        "",
        "`PREFIX` is the `source_prefix` in `dpnmt.json` (e.g. T5's task prefix). Or: "
        "`python -m dpnmt.translate --model=THIS_DIR --input=in.txt`.",
        "",
    ]
    return "\n".join(lines)
