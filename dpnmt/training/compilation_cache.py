"""The persistent XLA compilation cache of training runs (`train.compilation_cache`).

A repeated or resumed run loads its compiled programs instead of compiling them
again. The cache holds compiled programs keyed by their shapes, constants (σ,
C, L) and flags: no training data. Which shapes get compiled can depend on
private lot content (e.g. length buckets), so the cache lives outside the
published workdir, by default in the user's cache folder.
"""

import logging
import os

import jax

from dpnmt.errors import ConfigError
from dpnmt.training.run_dir import PRIVATE_DIR

AUTO, OFF = "auto", "off"
# What "auto" means on this machine, if set: "off" or a folder (tests set a temporary one).
ENV_VAR = "DPNMT_COMPILATION_CACHE"
# Programs that compile faster than this are not worth a cache entry (s), unless
# JAX's own variable says otherwise (jax reads it when imported).
MIN_COMPILE_SECONDS = 0.5
MIN_COMPILE_ENV_VAR = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"


def default_dir(environ: dict | None = None) -> str:
    """The cache folder `auto` means: $JAX_COMPILATION_CACHE_DIR (a sweep's), else the user's.

    Args:
      environ: the environment to read (default `os.environ`).

    Returns:
      $JAX_COMPILATION_CACHE_DIR if set, else $XDG_CACHE_HOME/dpnmt/jax, else
      ~/.cache/dpnmt/jax.
    """
    env = os.environ if environ is None else environ
    if env.get("JAX_COMPILATION_CACHE_DIR"):
        return env["JAX_COMPILATION_CACHE_DIR"]
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dpnmt", "jax")


def resolve(setting: str, environ: dict | None = None) -> str | None:
    """The folder `train.compilation_cache` names: None for "off".

    "auto" is $DPNMT_COMPILATION_CACHE ("off" or a folder) when set, else
    `default_dir`.
    """
    if setting == OFF:
        return None
    if setting == AUTO:
        env = os.environ if environ is None else environ
        if env.get(ENV_VAR):
            return resolve(env[ENV_VAR], {})
        return default_dir(environ)
    return os.path.expanduser(setting)


def problems(setting) -> list[str]:
    """What is wrong with a `train.compilation_cache` value (empty: nothing)."""
    if not isinstance(setting, str) or not setting:
        return [f"train.compilation_cache={setting!r} must be {AUTO!r}, {OFF!r} or a folder path."]
    folder = resolve(setting)
    if folder is not None and os.path.isfile(folder):
        return [
            f"train.compilation_cache={setting!r} is the file {folder}; give a folder, "
            f"{AUTO!r}, or {OFF!r}."
        ]
    return []


def enable(setting: str) -> str | None:
    """Points JAX's persistent compilation cache at `setting`'s folder, before any compile.

    Args:
      setting: `train.compilation_cache` ("auto", "off" or a folder).

    Programs that compiled in under `MIN_COMPILE_SECONDS` are not stored, unless
    $JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS sets JAX's own minimum.

    Returns:
      The cache folder, or None when off.

    Raises:
      ConfigError: a value that is neither auto, off nor a folder path.
    """
    found = problems(setting)
    if found:
        raise ConfigError(found[0])
    folder = resolve(setting)
    if folder is None:
        return None
    jax.config.update("jax_compilation_cache_dir", folder)
    if not os.environ.get(MIN_COMPILE_ENV_VAR):  # The user's JAX setting wins.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    logging.info("Compiled programs are cached in %s (train.compilation_cache).", folder)
    return folder


def in_workdir_problems(setting: str, workdir: str | None) -> list[str]:
    """`train.compilation_cache` inside the published workdir (outside its private/) is refused.

    Which shapes compile can depend on private lot content (length buckets).
    """
    folder = resolve(setting)
    if not workdir or folder is None or problems(setting):
        return []
    folder, root = os.path.realpath(folder), os.path.realpath(workdir)
    private = os.path.join(root, PRIVATE_DIR)
    inside = os.path.commonpath([folder, root]) == root
    if inside and os.path.commonpath([folder, private]) != private:
        return [
            f"train.compilation_cache resolves to {folder}, inside --workdir={workdir} "
            "(published): which shapes compile can depend on private lots; use a folder "
            f"outside it or under its {PRIVATE_DIR}/."
        ]
    return []
