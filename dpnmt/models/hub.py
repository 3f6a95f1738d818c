"""Whether a pretrained model's files can be had here, asked before a run writes anything.

A local folder is looked into. A hub id is asked of the hub once, briefly (one
HEAD request of its config.json, `HF_HUB_ETAG_TIMEOUT` seconds, no retries),
unless `HF_HUB_OFFLINE` is set; when the hub cannot be asked, the Hugging Face
cache must hold the files. Nothing is downloaded, so an unreachable hub is told
in a second rather than after the hub client's retries (~25 s a file).
"""

import logging
import os

from dpnmt.models.checks import looks_local

CONFIG_FILE = "config.json"
# (sharded index, single file) of each weight format `pretrained.load_state_dict` reads.
WEIGHT_FILES = (
    ("model.safetensors.index.json", "model.safetensors"),
    ("pytorch_model.bin.index.json", "pytorch_model.bin"),
)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "spiece.model",
    "sentencepiece.bpe.model",
)
_WEIGHTS = tuple(name for pair in WEIGHT_FILES for name in pair)


class HubUnreachable(OSError):
    """The hub did not answer (no network, DNS, proxy, timeout, offline mode)."""


def is_offline() -> bool:
    """`HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) is set: the hub is never asked."""
    from huggingface_hub import constants  # noqa: PLC0415 - only hub ids need it.

    return constants.is_offline_mode()


def hub_has(repo_id: str, filename: str) -> bool:
    """Whether the hub's `repo_id` has `filename`: one HEAD request, no retry.

    Raises:
      HubUnreachable: the hub did not answer within `HF_HUB_ETAG_TIMEOUT` seconds.
      OSError: the hub refused the repo (`huggingface_hub.errors.HfHubHTTPError`:
        unknown, private or gated without a token).
    """
    import httpx2  # noqa: PLC0415 - huggingface_hub's HTTP client.
    import huggingface_hub  # noqa: PLC0415
    from huggingface_hub import constants  # noqa: PLC0415
    from huggingface_hub.errors import OfflineModeIsEnabled, RemoteEntryNotFoundError  # noqa: PLC0415

    url = huggingface_hub.hf_hub_url(repo_id, filename)
    try:
        huggingface_hub.get_hf_file_metadata(url, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except RemoteEntryNotFoundError:
        return False
    except (httpx2.TransportError, OfflineModeIsEnabled) as error:
        raise HubUnreachable(f"{type(error).__name__}: {error}") from error
    return True


def _cached(repo_id: str, names: tuple[str, ...]) -> bool:
    """One of `names` of `repo_id` is in the Hugging Face cache (no request)."""
    import huggingface_hub  # noqa: PLC0415

    return any(
        isinstance(huggingface_hub.try_to_load_from_cache(repo_id, name), str) for name in names
    )


def _needed(needs_tokenizer: bool) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(what, the file names one of which it needs) of a model the run loads."""
    needed = (
        (CONFIG_FILE, (CONFIG_FILE,)),
        (f"weights ({' or '.join(n for _, n in WEIGHT_FILES)})", _WEIGHTS),
    )
    if needs_tokenizer:
        needed += ((f"tokenizer files ({', '.join(TOKENIZER_FILES)})", TOKENIZER_FILES),)
    return needed


def availability_problem(name_or_path: str, *, needs_tokenizer: bool) -> str | None:
    """Why the model `name_or_path` cannot be loaded here, in one line naming the fix; or None.

    Args:
      name_or_path: `model.name_or_path`, a local folder or a hub id.
      needs_tokenizer: the run uses the model's own tokenizer (`tokenizer.kind` pretrained).

    Returns:
      None when the files are there: a local folder holding them, a hub repo that
      answered, or the cache holding them (hub unreachable or `HF_HUB_OFFLINE`).
    """
    field = f"model.name_or_path={name_or_path!r}"
    folder = os.path.expanduser(name_or_path)
    needed = _needed(needs_tokenizer)
    if os.path.isdir(folder):
        missing = [
            what
            for what, names in needed
            if not any(os.path.isfile(os.path.join(folder, n)) for n in names)
        ]
        if not missing:
            return None
        return (
            f"{field}: the folder lacks {', '.join(missing)}; give a folder holding a Hugging "
            "Face model (what save_pretrained or python -m dpnmt.export write)."
        )
    if looks_local(name_or_path):
        return None  # "no such folder": `checks.model_problems`.
    from huggingface_hub.utils import validate_repo_id  # noqa: PLC0415

    try:
        validate_repo_id(name_or_path)
    except ValueError:
        return (
            f"{field} is neither a local folder nor a Hugging Face hub id; give the folder "
            "holding the model, or a hub id such as 'google/mt5-small'."
        )
    if is_offline():
        why = "HF_HUB_OFFLINE is set"
    else:
        try:
            if hub_has(name_or_path, CONFIG_FILE):
                return None  # The hub answered; the run downloads what it lacks.
            return (
                f"{field}: the hub repo has no {CONFIG_FILE}, so it is not a Transformers "
                "model; give a T5, mT5 or mBART model's hub id or local folder."
            )
        except HubUnreachable as error:
            why = f"the Hugging Face hub could not be reached ({error})"
        except OSError as error:  # The hub refused: unknown, private, gated.
            return (
                f"{field}: the Hugging Face hub refused it ({type(error).__name__}); check the "
                "id, or log in (hf auth login) for a private or gated model, or give a local "
                "folder holding it."
            )
    missing = [what for what, names in needed if not _cached(name_or_path, names)]
    if not missing:
        if not is_offline():
            logging.warning(
                "%s: %s; its cached copy is used (HF_HUB_OFFLINE=1 skips the hub's retries).",
                field,
                why,
            )
        return None
    return (
        f"{field} is no local folder, {why}, and the Hugging Face cache lacks its "
        f"{', '.join(missing)}. Fix: set model.name_or_path to a local folder holding the "
        f"model; or download it once online (hf download {name_or_path}) and run with "
        "HF_HUB_OFFLINE=1; or train from scratch (a config without model.name_or_path, "
        "e.g. configs/groups_clinspen.py)."
    )
