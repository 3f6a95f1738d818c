"""`benchmarks.whole_run`'s rows and table (no flags: importable beside other benchmarks)."""

# dpnmt's run -> the PyTorch run it is compared with.
PAIRS = {"dpnmt": "torch", "dpnmt_dp": "opacus"}


def rows(results: dict) -> list[dict]:
    """One row per run: training wall time, examples/s, and dpnmt / PyTorch on dpnmt's rows."""
    out = []
    for mode, result in results.items():
        train_s = result["process_s"] - result["excluded_s"]
        row = {"mode": mode, **result, "train_s": train_s}
        row["examples_per_s"] = result["examples"] / train_s
        out.append(row)
    by_mode = {row["mode"]: row for row in out}
    for ours, theirs in PAIRS.items():
        if ours in by_mode and theirs in by_mode:
            ratio = by_mode[ours]["examples_per_s"] / by_mode[theirs]["examples_per_s"]
            by_mode[ours]["vs_pytorch"] = ratio
    return out


NAMES = {
    "dpnmt": "dpnmt non-private",
    "dpnmt_dp": "dpnmt DP (ghost, Poisson)",
    "torch": "PyTorch non-private",
    "opacus": "PyTorch + Opacus DP",
}
COLUMNS = (
    "run", "examples", "lots", "process s", "excluded s", "train s", "of which loop s", "ex/s",
    "dpnmt/PyTorch",
)  # fmt: skip


def table(rows: list[dict]) -> str:
    """The Markdown table of the rows (one per run)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * (len(COLUMNS) - 1)]
    for row in rows:
        name = NAMES[row["mode"]]
        if row.get("opacus_mode"):
            name += f" ({row['opacus_mode']})"
        ratio = f"{row['vs_pytorch']:.2f}x" if "vs_pytorch" in row else ""
        cells = [
            name,
            str(row["examples"]),
            str(row["steps"]),
            f"{row['process_s']:.1f}",
            f"{row['excluded_s']:.1f}",
            f"{row['train_s']:.1f}",
            f"{row['loop_s']:.1f}",
            f"{row['examples_per_s']:.1f}",
            ratio,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
