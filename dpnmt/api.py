"""dpnmt from Python: load a config, train a run, translate text, plan its privacy.

    from dpnmt import api
    config = api.load_config("configs/first_run.py")
    results = api.train(config, "runs/multi30k")             # results.json's dict
    api.translate(["Ein Hund läuft."], workdir="runs/multi30k", no_repeat_ngram_size=6)
    api.plan(29_000, expected_lot_size=1024, num_epochs=20, target_epsilon=8)

The same code the apps run (`python -m dpnmt.train`, `dpnmt.translate`,
`dpnmt.plan`), with the same checks: a bad input raises a
`dpnmt.errors.InputError` naming it and the fix, before anything is written.
"""

from __future__ import annotations

from typing import Any

from dpnmt import release
from dpnmt.config import RunConfig, config_file
from dpnmt.planning import get_noise_multiplier, plan
from dpnmt.training.run_dir import RunDir

__all__ = ["finished_results", "get_noise_multiplier", "load_config", "plan", "train", "translate"]


def load_config(spec: str, **overrides: Any) -> Any:
    """A config file as `--config` reads it: `"configs/multi30k.py:eps8"` (`config.config_file`).

    Args:
        spec: A config file's path, then optionally `:` and its variants.
        **overrides: Dotted fields with `__` for the dots, e.g. `train__num_epochs=3`.

    Returns:
        The ConfigDict, overrides applied.

    Raises:
        MissingInputError: No such file.
    """
    return config_file.load_file(spec, {k.replace("__", "."): v for k, v in overrides.items()})


def finished_results(workdir: str, run: RunConfig) -> dict | None:
    """results.json of the run of `run` (its config) in `workdir` if it has finished, else None.

    A workdir bound to another config is not "finished" for this one: training
    then refuses it, naming the change (`RunDir.bind_config`).
    """
    import json  # noqa: PLC0415

    from dpnmt import config_lib  # noqa: PLC0415

    run_dir = RunDir(workdir)
    results = run_dir.read_results()
    if not (results and results.get("finished")):
        return None
    try:
        with open(run_dir.config_path) as f:
            bound = json.load(f)
    except (OSError, ValueError):
        return None
    return results if bound == config_lib.published_config(run) else None


def train(
    config: Any,
    workdir: str,
    *,
    stop_after_steps: int | None = None,
) -> dict:
    """Trains (or resumes) a run in `workdir`, one process, as `python -m dpnmt.train` does.

    Args:
        config: A ConfigDict (`load_config`) or a spec such as "configs/tiny.py:eps8".
        workdir: The run's folder; a finished run's results are returned as they are
            (nothing trained, decoded or rewritten).
        stop_after_steps: End this session after this step (checkpointed).

    Returns:
        results.json's dict (`{"finished": False, ...}` when stopped early).

    Raises:
        InputError: A bad config or workdir, every problem at once, before anything is written.
    """
    from dpnmt.training import compilation_cache, loop, preflight

    if isinstance(config, str):
        config = load_config(config)
    run: RunConfig = preflight.read_config(config, workdir)
    finished = finished_results(workdir, run)
    if finished is not None:
        return finished
    compilation_cache.enable(run.train.compilation_cache)
    return loop.train_and_evaluate(run, workdir, stop_after_steps=stop_after_steps)


def translate(
    texts: list[str],
    *,
    workdir: str | None = None,
    model: str | None = None,
    **decoding: int | float,
) -> list[str]:
    """Translations of `texts` by a run's latest checkpoint or an exported model.

    Args:
        texts: [num_texts] sentences; a blank one gives "".
        workdir: A training run's folder; or give `model`.
        model: A folder written by `python -m dpnmt.export` (or a hub id).
        **decoding: num_beams, length_penalty, no_repeat_ngram_size, max_new_tokens,
            batch_size; each left out is the run's or the export's recorded setting.

    Returns:
        [num_texts] translations.

    Raises:
        InputError: No such run or model, or a decoding setting out of range.
    """
    translator = release.load_translator(workdir=workdir, model_dir=model)
    return release.translate_lines(translator, list(texts), show_progress=False, **decoding)
