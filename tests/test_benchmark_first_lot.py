"""benchmarks.first_lot reads the trainer's own start-up log lines (benchmarks.start_up_log)."""

import pathlib

from benchmarks import start_up_log

_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _rendered(template: str) -> str:
    """A log format string with its %-fields filled as logging would fill them."""
    return template.replace("%d", "4").replace("%.1f", "1.0").replace("%s", "x")


def test_every_milestone_matches_a_line_the_trainer_logs():
    sources = [p.read_text() for p in (_ROOT / "dpnmt" / "training").glob("*.py")]
    logged = [
        _rendered(chunk.split('"')[1])
        for source in sources
        for chunk in source.split("logging.info(")[1:]
        if '"' in chunk
    ]
    for name, pattern in start_up_log.MILESTONES:
        assert any(pattern.search(line) for line in logged), name


def test_milestones_come_in_start_up_order_and_end_at_the_first_lot():
    names = [name for name, _ in start_up_log.MILESTONES]
    assert names[0] == "privacy plan" and names[-1] == "first lot starts"
    assert len(set(names)) == len(names)
