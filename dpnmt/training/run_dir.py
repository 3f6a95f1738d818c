"""A run's folder (`--workdir`): the one owner of its file names and private records.

Published (the workdir minus `private/`): config.json, results.json,
metrics.jsonl, tensorboard/, the vocabulary (tokenizer.model, vocabulary.json),
pretrained.json (what the starting model adds to ε, fixed when the run started),
checkpoints/, a non-private run's profile.json and `dpnmt.noise_to_signal`'s
noise_to_signal.json (measured on a public validation split). Private (`private/`, 0700,
never published): the secret noise seed, the run id, the sampler state of each
checkpoint, the session counter, the exact preprocessing counts of private
splits, a private run's profile, and what `dpnmt.noise_to_signal` and
`dpnmt.decode --split=validation` write when validation was carved from train
(`RunDir.output_path`).
"""

import json
import math
import os

import numpy as np

from dpnmt import atomic_file, config_lib, core
from dpnmt.config import RunConfig
from dpnmt.config.fields import flatten
from dpnmt.errors import ConfigError, InputError, raise_problems

CONFIG_FILE = "config.json"
RESULTS_FILE = "results.json"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
# One event file a session, numbered: tensorboardX's own name holds the session's
# start second and the hostname. TensorBoard reads any name holding "tfevents",
# in name order (older workdirs' files, named by time, sort first).
TENSORBOARD_FILE_PREFIX = "events.out.tfevents.session-"
TOKENIZER_FILE = "tokenizer.model"
VOCABULARY_RECORD_FILE = "vocabulary.json"
# The starting model's `PretrainedClaim` as the run started: decode and export
# report it, never the base model's record read again (it may have changed).
PRETRAINED_FILE = "pretrained.json"
CHECKPOINT_DIR = "checkpoints"
PRIVATE_DIR = "private"  # Secret seed and sampler state: never publish this folder.
PREPROCESSING_FILE = "preprocessing.json"  # In private/: exact counts of private splits.
NOISE_SEED_FILE = "noise_seed"
RUN_ID_FILE = "run_id"
SESSIONS_FILE = "sessions"
SAMPLER_PREFIX = "sampler_step_"  # private/sampler_step_<step>.json: a checkpoint's sampler.
# Where a session's wall time went (`train.profile`): in private/ for a private run.
PROFILE_FILE = "profile.json"
NOISE_TO_SIGNAL_FILE = "noise_to_signal.json"  # In private/ when validation is private.
SWEEP_MANIFEST_FILE = "sweep.json"  # dpnmt.sweeps.grid.MANIFEST_FILE (a sweep's folder).


def _json_default(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return str(value)


def strict_json(value):
    """`value` with non-finite floats as strings ("inf"), so files are strict JSON."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        return str(float(value))
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return value


def write_json(path: str, value) -> None:
    """Writes strict JSON (no NaN/Infinity tokens) atomically: a kill leaves the old or the new.

    A file under a `private/` folder is the owner's alone (0600); others get the usual mode.
    """
    text = json.dumps(strict_json(value), indent=2, default=_json_default, allow_nan=False)
    private = PRIVATE_DIR in os.path.normpath(os.path.abspath(path)).split(os.sep)[:-1]
    atomic_file.write_atomic(path, text, private=private)


def json_dumps(value) -> str:
    """One-line JSON of `value` (numpy scalars as numbers, the rest as strings)."""
    return json.dumps(value, default=_json_default)


def derived_seed(seed: int, purpose: str) -> int:
    """A 128-bit seed for `purpose` (noise, sampler, vocabulary, dropout, objective)."""
    purposes = {"noise": 0, "sampler": 1, "vocabulary": 2, "dropout": 3, "objective": 4}
    words = np.random.SeedSequence([seed, purposes[purpose]]).generate_state(4, np.uint32)
    return sum(int(word) << (32 * i) for i, word in enumerate(words))


class RunDir:
    """The files of one training run under `path`; process 0 alone writes them."""

    def __init__(self, path: str):
        """Names the folder; nothing is created until something is written."""
        self.path = path

    def file(self, name: str) -> str:
        """The path of a published file, e.g. `file(RESULTS_FILE)`."""
        return os.path.join(self.path, name)

    def private_file(self, name: str) -> str:
        """The path of a file under `private/`."""
        return os.path.join(self.path, PRIVATE_DIR, name)

    @property
    def config_path(self) -> str:
        """`config.json`: the resolved config the run is bound to."""
        return self.file(CONFIG_FILE)

    @property
    def results_path(self) -> str:
        """`results.json`: the published results (format: `dpnmt.training.loop`)."""
        return self.file(RESULTS_FILE)

    def bind_config(self, run: RunConfig) -> None:
        """Writes the published config (noise seed removed), or refuses a workdir made by another.

        A workdir is bound to its config once it holds a checkpoint; one holding
        only a learnt vocabulary is bound in the fields the vocabulary depends on
        (`binding_changes`: learning it again would spend privacy
        again). Otherwise a corrected config simply replaces the old one.
        """
        raise_problems(workdir_problems(self.path, run))
        resolved = config_lib.published_config(run)  # config.json never holds the seed.
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as error:
            raise ConfigError(f"--workdir={self.path} cannot be created: {error}") from error
        if os.path.exists(self.config_path):
            with open(self.config_path) as f:
                if json.load(f) == resolved:
                    return
        atomic_file.write_atomic(self.config_path, json.dumps(resolved, indent=2, sort_keys=True))

    def committed_step(self) -> int | None:
        """The step of the latest committed checkpoint, or None when there is none.

        Orbax writes a checkpoint under a temporary name and renames it to its step
        once committed, so only folders named by a number count.
        """
        folder = self.file(CHECKPOINT_DIR)
        steps = [int(n) for n in os.listdir(folder) if n.isdigit()] if os.path.isdir(folder) else []
        return max(steps, default=None)

    def read_results(self) -> dict | None:
        """results.json as written, or None when there is none."""
        if not os.path.exists(self.results_path):
            return None
        with open(self.results_path) as f:
            return json.load(f)

    def write_results(self, results: dict) -> None:
        """Writes results.json (strict JSON)."""
        write_json(self.results_path, results)

    def new_tensorboard_file(self) -> str:
        """The path of this session's TensorBoard event file (the next number; folder made)."""
        folder = self.file(TENSORBOARD_DIR)
        os.makedirs(folder, exist_ok=True)
        numbers = [
            int(name[len(TENSORBOARD_FILE_PREFIX) :])
            for name in os.listdir(folder)
            if name.startswith(TENSORBOARD_FILE_PREFIX)
            and name[len(TENSORBOARD_FILE_PREFIX) :].isdigit()
        ]
        number = max(numbers, default=0) + 1
        return os.path.join(folder, f"{TENSORBOARD_FILE_PREFIX}{number:04d}")

    def write_pretrained(self, claim: dict) -> None:
        """Writes `pretrained.json`: the starting model's claim (`PretrainedClaim`'s JSON)."""
        write_json(self.file(PRETRAINED_FILE), claim)

    def read_pretrained(self) -> dict | None:
        """`pretrained.json` as written, or None (from scratch, or a run from before it).

        Raises:
          InputError: the file is not a JSON object (cut short or edited).
        """
        path = self.file(PRETRAINED_FILE)
        if not os.path.exists(path):
            return None
        try:
            with open(path, encoding="utf-8") as f:
                claim = json.load(f)
        except (ValueError, UnicodeDecodeError) as error:
            claim = error
        if not isinstance(claim, dict):
            raise InputError(
                f"{path} is not the JSON object dpnmt wrote ({claim}): it records the privacy "
                "claim of the model this run started from, which a resumed run, decode and "
                "export reuse. Restore it from a copy of the workdir; deleting it makes dpnmt "
                "read model.name_or_path's record again, right only if that model is unchanged "
                "since the run started."
            )
        return claim

    def output_path(self, name: str, *, private: bool) -> str:
        """Where an output computed on the run's data goes: `private/<name>` when it is private.

        One rule for every app that writes into a run's folder (`dpnmt.decode`,
        `dpnmt.noise_to_signal`): what is computed on private pairs (a validation
        split carved from train) goes under `private/`, the rest beside results.json.
        """
        return self.private_file(name) if private else self.file(name)

    def write_private_json(self, name: str, value) -> None:
        """Writes `private/<name>` (strict JSON), creating `private/`."""
        atomic_file.make_private_folder(os.path.join(self.path, PRIVATE_DIR))
        write_json(self.private_file(name), value)

    def write_profile(self, profile: dict, *, private: bool) -> str:
        """Writes a session's profile (`dpnmt.training.profile`); returns its path.

        A private run's step and lot-preparation times depend on its realised lot
        sizes, so its profile goes to `private/` (never published); a non-private
        run's goes beside results.json.
        """
        if private:
            self.write_private_json(PROFILE_FILE, profile)
            return self.private_file(PROFILE_FILE)
        write_json(self.file(PROFILE_FILE), profile)
        return self.file(PROFILE_FILE)

    def noise_seed(self, config: RunConfig, resuming: bool) -> int:
        """The run's secret seed: 128 bits from the OS (or a test's fixed one), in `private/`.

        It derives the noise keys, the Poisson sampler's seed and the vocabulary's
        noise. Anyone who has it can subtract the noise: never publish `private/`.
        Nothing published holds it or anything derived from it. Created once and
        whole (`atomic_file.create_exclusive`): of two processes starting at once,
        both get the one seed written first; it is never overwritten.
        """
        path = self.private_file(NOISE_SEED_FILE)
        if not os.path.exists(path):
            if resuming:
                raise ValueError(
                    f"{self.path} has checkpoints but no {path}; cannot resume safely."
                )
            seed = config.noise_seed if config.noise_seed is not None else core.fresh_seed()
            atomic_file.make_private_folder(os.path.dirname(path))
            atomic_file.create_exclusive(path, str(seed))
        seed = _read_number(path, "the run's secret noise seed")
        if config.noise_seed is not None and int(config.noise_seed) != seed:
            raise ValueError(
                f"config.noise_seed differs from the seed in {path}; drop "
                "--config.noise_seed to resume, or use a new --workdir."
            )
        return seed

    def run_id(self) -> int:
        """A random 128-bit nonce in `private/run_id`, drawn once; checkpoints record it.

        It ties a checkpoint to this workdir's private records without publishing
        anything derived from the seed (it is independent of the seed). Created
        once and whole, like the seed.
        """
        path = self.private_file(RUN_ID_FILE)
        if not os.path.exists(path):
            atomic_file.make_private_folder(os.path.dirname(path))
            atomic_file.create_exclusive(path, str(core.fresh_seed()))
        return _read_number(path, "the run id that binds its checkpoints")

    def count_session(self) -> int:
        """How many sessions this workdir has run (0 for the first), counted in private/."""
        path = self.private_file(SESSIONS_FILE)
        count = _read_number(path, "the session counter") if os.path.exists(path) else 0
        atomic_file.write_atomic(path, str(count + 1), private=True)
        return count

    def sampler_path(self, step: int) -> str:
        """Where the sampler state of the checkpoint at `step` lives (in private/)."""
        # Lot membership is private: the sampler state stays out of the checkpoint.
        return self.private_file(f"{SAMPLER_PREFIX}{step}.json")

    def save_sampler_state(self, step: int, state: dict) -> None:
        """Writes the lot sampler's `state_dict()` for the checkpoint at `step`."""
        out = dict(state)
        if out.get("generator_state") is not None:
            out["generator_state"] = np.asarray(out["generator_state"], np.uint8).tolist()
        atomic_file.write_atomic(self.sampler_path(step), json.dumps(out), private=True)

    def load_sampler_state(self, step: int) -> dict:
        """The sampler state saved with the checkpoint at `step`."""
        with open(self.sampler_path(step)) as f:
            out = json.load(f)
        if out.get("generator_state") is not None:
            out["generator_state"] = np.asarray(out["generator_state"], np.uint8)
        return out


def _read_number(path: str, what: str) -> int:
    """The integer `path` holds; `InputError` (one line: the file, the fix) if empty or garbled."""
    with open(path) as f:
        text = f.read()
    try:
        return int(text)
    except ValueError:
        raise InputError(
            f"{path} holds {what} but is not a number ({len(text)} characters, not shown: cut "
            "short by a kill of an older dpnmt, or edited); restore it from a copy of the workdir"
            ", or start a new --workdir (a new seed: a second, unaccounted run on the same data)."
        ) from None


# A learnt vocabulary depends on these (prefixes end in "."): the train text
# (corpus, pair, folder, carving, truncation to K pairs), how it is learnt, and
# its noise seed (`training.pieces.build_tokenizer`). A workdir holding a vocabulary
# but no checkpoint accepts a config that differs in other fields only.
VOCABULARY_FIELDS = (
    "data.corpus",
    "data.corpus_weights",
    "data.pair",
    "data.dir",
    "data.validation_size",
    "data.bsd_train_split",
    "data.max_train_examples",
    "data.concat_weight",  # A vocabulary learnt from joined pairs sees a pair several times.
    "data.concat_max_pairs",
    "data.concat_max_chars",
    "tokenizer.",
    "noise_seed",
    "model.name_or_path",
)


# Fields a resumed run may change: they change how, not what, it trains (the
# examples, N, lots and noise are the same).
# `dp.allow_large_delta` changes what is accepted, not what trains or is claimed.
# `model.pretrained_data_disjoint` changes the claimed ε (the export's is not
# composed): it binds once the run has started, like the fields that change what
# trains (a run from before it resumes with it at its default, False).
NOT_BINDING_FIELDS = frozenset(
    {
        "data.tokenize_train",
        "data.length_buckets",
        "train.profile",
        "train.compilation_cache",
        "dp.allow_large_delta",
    }
)


def _trained(workdir: str) -> bool:
    """Whether a session trained at least one step here (metrics logged after step 0)."""
    path = os.path.join(workdir, METRICS_FILE)
    if not os.path.exists(path):
        return False
    with open(path) as f:
        for line in f:
            try:
                if json.loads(line).get("step", 0) > 0:
                    return True
            except (json.JSONDecodeError, AttributeError):
                return True  # Unreadable: assume the worst.
    return False


def _is_bound(workdir: str) -> tuple[bool, bool]:
    """(bound in every field, holds a learnt vocabulary).

    Every field binds once a checkpoint exists, or once a session trained
    (metrics after step 0 may be published, and the noise seed in private/ is
    reused by a rerun: a different config would be a second, unaccounted use).
    """
    checkpoints = os.path.join(workdir, CHECKPOINT_DIR)
    has_checkpoint = os.path.isdir(checkpoints) and bool(os.listdir(checkpoints))
    fully = has_checkpoint or _trained(workdir)
    return fully, os.path.exists(os.path.join(workdir, TOKENIZER_FILE))


def _depends_vocabulary(field: str) -> bool:
    return any(field == f or (f.endswith(".") and field.startswith(f)) for f in VOCABULARY_FIELDS)


def binding_changes(workdir: str, run: RunConfig) -> list[str]:
    """Fields in which `config` differs from the run `workdir` is bound to.

    A workdir is bound once it holds a checkpoint or trained a step (every
    field but `NOT_BINDING_FIELDS` counts), or a learnt vocabulary only (only
    `VOCABULARY_FIELDS` count: nothing else has been spent or released yet).

    Returns:
      The differing fields, sorted; empty when unbound or the same.
    """
    return _binding_diff(workdir, config_lib.config_json(run))[0]


def _binding_diff(workdir: str, published: dict) -> tuple[list[str], dict, dict]:
    """(`binding_changes`, the run's flattened config.json, `published` flattened)."""
    path = os.path.join(workdir, CONFIG_FILE)
    fully_bound, has_vocabulary = _is_bound(workdir)
    if not os.path.exists(path) or not (fully_bound or has_vocabulary):
        return [], {}, {}
    with open(path) as f:
        previous = flatten(json.load(f))
    current = flatten(published)
    # A field newer than the workdir's config.json, at its default, is not a
    # change: new fields default to the behaviour the run had.
    defaults = flatten(config_lib.config_json(RunConfig()))
    newer = {k for k in current.keys() - previous.keys() if defaults.get(k, ...) != current[k]}
    changed = sorted(
        (previous.keys() - current.keys())
        | newer
        | {k for k, v in current.items() if previous.get(k, v) != v}
    )
    changed = [k for k in changed if k not in NOT_BINDING_FIELDS]
    if not fully_bound:
        changed = [k for k in changed if _depends_vocabulary(k)]
    return changed, previous, current


def workdir_problems(workdir: str | None, run: RunConfig | None = None) -> list[str]:
    """Problems of a train workdir: unset, a file, a sweep folder, unwritable, bound elsewhere."""
    if not workdir:
        return ["--workdir is required: the run's output folder."]
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        return [f"--workdir={workdir} is a file; give a folder."]
    if os.path.exists(os.path.join(workdir, SWEEP_MANIFEST_FILE)):
        return [
            f"--workdir={workdir} is a sweep folder (it holds {SWEEP_MANIFEST_FILE}); train in a "
            "new folder, or rerun the sweep (python -m dpnmt.sweep) to resume its runs."
        ]
    existing = workdir
    while existing and not os.path.exists(existing):
        existing = os.path.dirname(existing.rstrip(os.sep)) or "."
    if not os.access(existing, os.W_OK):
        return [f"--workdir={workdir} is not writable ({existing}); choose another folder."]
    if run is not None:  # config.json holds the published config (no noise seed).
        changed, bound, now = _binding_diff(workdir, config_lib.published_config(run))
        if changed:
            differ = "; ".join(
                f"{k}: run {bound.get(k, '(absent)')!r}, now {now.get(k, '(absent)')!r}"
                for k in changed
            )
            resume = " ".join(
                f"--config.{k}={bound[k]}" for k in changed if k in bound and k in now
            )
            return [
                f"--workdir={workdir} holds a run with a different config (fields differ: "
                f"{differ}); use a new --workdir, or resume with the run's values"
                + (f": {resume}" if resume else "")
                + " (or with --workdir alone: its config.json)."
            ]
    return []
