"""Per-pair and per-group guarantees side by side, from published run folders (issue 31).

One row per finished run (`runs_table.load_runs`: each private run's ε
recomputed with dp_accounting first). A per-pair run reports ε per pair and,
over a corpus with groups, the group-privacy ε of its largest group
(results.json "group_privacy"); a group-level run (`dp.unit=group`) reports ε
per group ("privacy_unit") and, per pair, the group-privacy bound over the two
groups a change inside one group amounts to (remove it, add it back changed):
2ε at δ' = (1 + e^ε) δ.
"""

import math

from dpnmt.sweeps import runs_table
from dpnmt.sweeps.runs_table import PublishedRun
from dpnmt.sweeps.summary import as_float

# (key, Markdown header).
COLUMNS = (
    ("run", "run"),
    ("unit", "unit"),
    ("n", "N"),
    ("lot_size", "L"),
    ("k", "k"),
    ("sigma", "σ"),
    ("steps", "steps"),
    ("epsilon_pair", "ε per pair"),
    ("epsilon_group", "ε per group"),
    ("vocabulary", "vocabulary"),
    ("bleu", "test BLEU"),
    ("validation_loss", "validation loss"),
)
DIGITS = {"n": 0, "lot_size": 0, "k": 0, "sigma": 3, "steps": 0, "bleu": 2, "validation_loss": 3}
VOCABULARY = {
    "sentencepiece_private": "private, no DP (total ε ∞)",
    "sentencepiece_public": "public (no ε)",
    "dp_sentencepiece": "DP-SentencePiece",
    "pretrained": "the pretrained model's",
}


def _epsilon(value: float) -> str:
    """ε as written in the table: 2 decimals, none from 100 up."""
    if math.isinf(value):
        return "∞"
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


def row(run: PublishedRun) -> dict:
    """The run's row keyed by `COLUMNS`' keys (strings: the cells as written)."""
    privacy, results = run.privacy, run.results
    epsilon = as_float(privacy["dp_sgd_epsilon"])
    unit = privacy.get("privacy_unit")
    vocabulary = privacy["vocabulary"]
    out = {
        "run": run.name,
        "n": privacy["dataset_size"],
        "lot_size": privacy["expected_lot_size"],
        "sigma": as_float(privacy["noise_multiplier"]),
        "steps": results["steps_done"],
        "vocabulary": VOCABULARY.get(vocabulary["kind"], vocabulary["kind"]),
        "bleu": as_float(results["test"].get("bleu")),
        # Unpublished (NaN) when validation was carved from the private train split.
        "validation_loss": math.nan
        if runs_table.private_validation(run)
        else as_float(results["validation"].get("loss")),
    }
    if unit is not None:  # dp.unit=group: N, L count groups; ε is per group.
        delta = float(privacy["dp_sgd_delta"])
        pair_delta = (1 + math.exp(epsilon)) * delta if math.isfinite(epsilon) else 1.0
        out |= {
            "unit": "group",
            "k": unit["group_cap"],
            "epsilon_group": _epsilon(epsilon),
            "epsilon_pair": f"≤ {_epsilon(2 * epsilon)} (δ {pair_delta:.1g}; 2 groups)",
        }
        return out
    claim = privacy.get("group_privacy")
    out |= {"unit": "pair", "epsilon_pair": _epsilon(epsilon)}
    if claim is None:
        return out | {"k": math.nan, "epsilon_group": "–"}
    k = claim["largest_group"]
    group = _epsilon(as_float(claim["dp_sgd_epsilon"]))
    return out | {"k": k, "epsilon_group": f"{group} (bound, {k} pairs)"}


def to_markdown(rows: list[dict]) -> str:
    """The table as Markdown, then a note on what each column is."""
    lines = runs_table.markdown_rows(rows, COLUMNS, DIGITS)
    lines += [
        "",
        "unit: the privacy unit DP-SGD protected (pair: `dp.unit=example`; group: "
        "`dp.unit=group`, a case report or dialogue). N and L count that unit (pairs or "
        "groups). k: per pair, the largest group's pairs; per group, the cap on one group's "
        "pairs in a lot. ε per pair / per group: DP-SGD's, at the run's δ and planned steps. "
        "A per-pair run's ε per group is the group-privacy ε of its largest group "
        "(`core.compute_group_epsilon`); a per-group run's ε per pair is the group-privacy "
        "bound over 2 groups (a pair changed inside one group). Every ε DP-SGD recomputed "
        "with dp_accounting from the run's results.json. vocabulary: private = learnt from "
        "the private pairs without DP (outside the guarantee). validation loss: on the "
        "corpus's own (public) validation split, at the end.",
    ]
    return "\n".join(lines) + "\n"
