"""A hyper-parameter grid's table and the rule that picks its winner, from published run folders.

One row per finished run (`runs_table.load_runs`: every private run's ε
recomputed with dp_accounting first): its learning rate, C and the parameter
average's decay (config.json; 0: none),
L, epochs, σ, ε, and its final validation loss and BLEU, which pick the
winner of each group of rows at one (ε, fine-tuned parameters; ε the config's
target ε where it set one, since runs calibrated to one target at other L or T
land a little apart under it):

  the highest validation BLEU; every run within `TIE_BLEU` of it counts as
  tied, and the tie goes to the lowest validation loss.

BLEU differences that small are within a seed's noise on a few hundred
sentences, where the loss (over every target token) still ranks the runs.
Choosing on a validation split carved from the private train split would
spend privacy the report does not count: such a run is refused.
"""

import math
import os

from dpnmt.errors import ConfigError
from dpnmt.sweeps import grid, runs_table
from dpnmt.sweeps.runs_table import PublishedRun
from dpnmt.sweeps.summary import as_float
from dpnmt.training.run_dir import CONFIG_FILE

TIE_BLEU = 0.5  # Validation BLEU points within which runs count as tied.
CHOSEN = "✓"
COLUMNS = (
    ("run", "run"),
    ("finetune", "fine-tuned"),
    ("learning_rate", "learning rate"),
    ("l2_clip", "C"),
    ("ema_decay", "average"),
    ("lot_size", "L"),
    ("epochs", "epochs"),
    ("sigma", "σ"),
    ("epsilon", "ε DP-SGD"),
    ("validation_loss", "validation loss"),
    ("validation_bleu", "validation BLEU"),
    ("bleu", "test BLEU"),
    ("chosen", "chosen"),
)
DIGITS = {"l2_clip": 2, "lot_size": 0, "epochs": 1, "sigma": 3, "epsilon": 2}
DIGITS |= {"validation_loss": 3, "validation_bleu": 2, "bleu": 2}


def _config(run: PublishedRun) -> dict:
    config = grid.read_json(os.path.join(run.folder, CONFIG_FILE))
    if config is None:
        raise ConfigError(f"{run.folder} has no readable {CONFIG_FILE}: the grid's rate is there.")
    return config


def _target(config: dict) -> float | None:
    """The config's target ε when σ was calibrated to it, else None (σ given, or no DP)."""
    dp = config.get("dp", {})
    if not dp.get("enabled") or dp.get("noise_multiplier") is not None:
        return None
    return dp.get("target_epsilon")


def row(run: PublishedRun) -> dict:
    """The run's row keyed by `COLUMNS`' keys ("chosen" empty until `choose`).

    Raises:
      ConfigError: the run's validation pairs came from its private train split.
    """
    if runs_table.private_validation(run):
        raise ConfigError(
            f"{run.folder}: its validation pairs were carved from the private train split; "
            "choosing hyper-parameters on them spends privacy no report counts. Tune on a "
            "public validation split (a public stand-in task)."
        )
    config, privacy, results = _config(run), run.privacy, run.results
    return {
        "run": run.name,
        "finetune": config.get("model", {}).get("finetune", "all"),
        "learning_rate": f"{config['train']['learning_rate']:g}",
        "l2_clip": as_float(privacy["l2_clip"]),
        "ema_decay": f"{config['train'].get('ema_decay', 0.0):g}",
        "lot_size": privacy["expected_lot_size"],
        "epochs": results["steps_done"] / run.steps_per_epoch,
        "sigma": as_float(privacy["noise_multiplier"]),
        "epsilon": as_float(privacy["dp_sgd_epsilon"]),
        "target_epsilon": _target(config) if privacy["private"] else None,
        "setting": (
            privacy.get("dp_sgd_delta"),
            privacy.get("sampling"),
            (privacy.get("privacy_unit") or {}).get("unit", "example"),
        ),
        "validation_loss": as_float(results["validation"].get("loss")),
        "validation_bleu": as_float(results["validation"].get("bleu")),
        "bleu": as_float(results["test"].get("bleu")),
        "chosen": "",
    }


def _group(r: dict) -> tuple:
    """(ε, δ/sampling/unit, fine-tuned); ε the target σ was calibrated to, else the achieved ε.

    Runs calibrated to one target at other L or T land a little apart under it
    (achieved ε to 0.01 where σ was given).
    """
    if r.get("target_epsilon") is not None:
        epsilon = float(r["target_epsilon"])
    else:
        epsilon = round(r["epsilon"], 2) if math.isfinite(r["epsilon"]) else "∞"
    # (δ, sampling, unit): a different guarantee, another group.
    return (epsilon, r.get("setting"), r["finetune"])


def choose(rows: list[dict]) -> list[dict]:
    """The rows with the winner of each (ε, fine-tuned) group marked `CHOSEN` (module rule)."""
    marked = [dict(r, chosen="") for r in rows]
    for key in dict.fromkeys(_group(r) for r in marked):
        group = [r for r in marked if _group(r) == key and not math.isnan(r["validation_bleu"])]
        if not group:
            continue
        best = max(r["validation_bleu"] for r in group)
        tied = [r for r in group if r["validation_bleu"] >= best - TIE_BLEU]
        min(tied, key=lambda r: r["validation_loss"])["chosen"] = CHOSEN
    return marked


def to_markdown(rows: list[dict]) -> str:
    """The table as Markdown, then the rule."""
    lines = runs_table.markdown_rows(choose(rows), COLUMNS, DIGITS)
    lines += [
        "",
        "average: `train.ema_decay`, the decay of the parameters' moving average the run "
        "evaluates (0: the last iterate). "
        f"chosen ({CHOSEN}): in each group of runs at one ε and one set of fine-tuned "
        f"parameters, the highest final validation BLEU, ties within {TIE_BLEU} BLEU going "
        "to the lowest final validation loss (nats per target token). Validation: the "
        "corpus's own public split. ε DP-SGD recomputed with dp_accounting from each run's "
        "results.json.",
    ]
    return "\n".join(lines) + "\n"
