"""The sweep report's figures (matplotlib, Agg backend, PNG files).

`bleu_vs_epsilon` (the paper's Figure 2), `learning_curves` (validation loss
and BLEU by step) and `epsilon_vs_step` (ε spent by step), each from finished runs
(`summary.load_runs`) or the aggregated rows (`summary.cell_rows`);
`curves_by_epoch` for published run folders (`runs_table`).
"""

import math

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # Files only; no display needed.
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from dpnmt.sweeps import summary  # noqa: E402

SAMPLING_STYLE = {"poisson": ("tab:blue", "o"), "shuffle": ("tab:orange", "s")}


def bleu_vs_epsilon(rows: list[dict], path: str) -> None:
    """Test BLEU (mean ± std over seeds) against the reported DP-SGD ε, log-x.

    Non-private runs (ε = ∞) are drawn apart at the right, past a dashed line.

    Args:
      rows: `summary.cell_rows` output.
      path: PNG file to write.
    """
    finite = [r["epsilon"] for r in rows if math.isfinite(r["epsilon"])]
    x_infinity = 10.0 ** (math.ceil(math.log10(max(finite))) + 1) if finite else 1.0
    fig, ax = plt.subplots(figsize=(6, 4))
    for sampling, (color, marker) in SAMPLING_STYLE.items():
        mine = sorted((r for r in rows if r["sampling"] == sampling), key=lambda r: r["epsilon"])
        if not mine:
            continue
        points = [r for r in mine if math.isfinite(r["epsilon"])]
        if points:
            ax.errorbar(
                [r["epsilon"] for r in points],
                [r["bleu_mean"] for r in points],
                yerr=[np.nan_to_num(r["bleu_std"]) for r in points],
                color=color,
                marker=marker,
                capsize=3,
                label=sampling,
            )
        for r in mine:
            if not math.isfinite(r["epsilon"]):
                ax.errorbar(
                    [x_infinity],
                    [r["bleu_mean"]],
                    yerr=[np.nan_to_num(r["bleu_std"])],
                    color=color,
                    marker=marker,
                    capsize=3,
                    label=None if points else sampling,
                )
    ax.set_xscale("log")
    ticks = sorted({float(f"{e:.2g}") for e in finite})  # Bounds land just under targets.
    if finite:
        ax.axvline(math.sqrt(max(finite) * x_infinity), color="grey", linestyle="--", lw=0.8)
    if any(not math.isfinite(r["epsilon"]) for r in rows):
        ticks.append(x_infinity)
    ax.set_xticks(ticks, [f"{t:g}" if t != x_infinity else "∞" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("ε (DP-SGD, reported bound; ∞ = non-private)")
    ax.set_ylabel("test BLEU (mean ± std over seeds)")
    ax.legend(title="sampling")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _curve(runs: list[summary.Run], key: str) -> tuple[np.ndarray, np.ndarray]:
    """Validation `key` by step, averaged over the runs at the steps they share."""
    by_step: dict[int, list[float]] = {}
    for run in runs:
        # The evaluation before training scores the loss only (no BLEU).
        points = [(h["step"], h[key]) for h in run.results["history"] if key in h]
        points.append((run.results["steps_done"], run.results["validation"][key]))
        for step, value in points:
            by_step.setdefault(int(step), []).append(float(value))
    steps = sorted(s for s, v in by_step.items() if len(v) == len(runs))
    return np.asarray(steps), np.asarray([np.mean(by_step[s]) for s in steps])


def _cells(runs: list[summary.Run]) -> dict[tuple[str, str], list[summary.Run]]:
    cells: dict[tuple[str, str], list[summary.Run]] = {}
    for run in runs:
        cells.setdefault((run.spec.privacy, run.spec.sampling), []).append(run)
    return cells


def learning_curves(runs: list[summary.Run], path: str) -> None:
    """Validation loss and BLEU by step: a column per sampling, a line per privacy variant."""
    cells = _cells(runs)
    samplings = [s for s in SAMPLING_STYLE if any(k[1] == s for k in cells)]
    metrics = (("loss", "validation loss (nats/token)"), ("bleu", "validation BLEU"))
    fig, axes = plt.subplots(
        len(metrics), len(samplings), figsize=(5 * len(samplings), 6.4), squeeze=False
    )
    for column, sampling in enumerate(samplings):
        for row, (key, label) in enumerate(metrics):
            ax = axes[row][column]
            for (privacy, cell_sampling), members in cells.items():
                if cell_sampling == sampling:
                    steps, values = _curve(members, key)
                    ax.plot(steps, values, marker=".", label=f"{privacy} (n={len(members)})")
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
            ax.set_title(f"{sampling} lots (mean over seeds)")
            ax.set_xlabel("step (lots)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def epsilon_vs_step(runs: list[summary.Run], path: str) -> None:
    """DP-SGD ε spent by step for each private cell (its bound; non-private omitted)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for (privacy, sampling), members in _cells(runs).items():
        results = members[0].results  # ε by step is the same for every seed of a cell.
        if not members[0].privacy.private:
            continue
        points = [(h["step"], summary.as_float(h["epsilon"])) for h in results["history"]]
        final = members[0].privacy.dp_sgd_epsilon
        points.append((results["steps_done"], final))
        points = sorted(set(points))
        marker = SAMPLING_STYLE[sampling][1]
        linestyle = "-" if sampling == "poisson" else "--"
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker=marker,
            linestyle=linestyle,
            label=f"{privacy}, {sampling}",
        )
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("step (lots)")
    ax.set_ylabel("ε spent (DP-SGD; shuffle: no amplification)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def curves_by_epoch(curves: dict[str, list[dict]], path: str) -> None:
    """Validation loss and BLEU by epoch, one line per run (`runs_table.validation_curve`)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    metrics = (("loss", "validation loss (nats/token)"), ("bleu", "validation BLEU"))
    for ax, (key, label) in zip(axes, metrics, strict=True):
        for name, points in curves.items():
            mine = [(p["epoch"], p[key]) for p in points if key in p]
            ax.plot([p[0] for p in mine], [p[1] for p in mine], marker=".", label=name)
        ax.set_xlabel("epoch (steps · L / N)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_curves(series: dict[str, list[tuple[int, float]]], validation: list[dict], path: str):
    """One run by step: training loss (non-private runs), validation loss and BLEU, ε spent.

    Args:
        series: `report.step_series` (name -> [(step, value)]).
        validation: `runs_table.validation_curve` points ({"step", "loss"?, "bleu"?}).
        path: the PNG to write.
    """
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    panels = (
        (axes[0], [("train loss", series["train loss"])], "training loss (nats/token)"),
        (
            axes[1],
            [
                (f"validation {key}", [(p["step"], p[key]) for p in validation if key in p])
                for key in ("loss", "bleu")
            ],
            "validation loss / BLEU",
        ),
        (axes[2], [(k, v) for k, v in series.items() if k.startswith("ε")], "ε spent"),
    )
    for ax, lines, label in panels:
        for name, points in lines:
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=name)
        if not ax.get_legend_handles_labels()[0]:  # Say why a panel is empty.
            why = "none: non-private (ε ∞), or private (no training loss published)"
            ax.text(0.5, 0.5, why, ha="center", transform=ax.transAxes, fontsize=8)
        else:
            ax.legend(fontsize=8)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel("step (lots)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
