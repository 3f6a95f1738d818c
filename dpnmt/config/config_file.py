"""A config file by path, as `--config=FILE:VARIANT` reads it, for Python callers (`dpnmt.api`)."""

import importlib.util
import os
from typing import Any

import ml_collections

from dpnmt.errors import MissingInputError


def load_file(spec: str, overrides: dict[str, Any] | None = None) -> ml_collections.ConfigDict:
    """`"configs/x.py:variant"`: the file's `get_config(variant)`, with dotted `overrides` set.

    Args:
      spec: a config file's path, then optionally `:` and its variants.
      overrides: {"train.num_epochs": 3, ...}.

    Returns:
      The ConfigDict.

    Raises:
      MissingInputError: no such file.
    """
    path, _, variant = spec.partition(":")
    if not os.path.isfile(path):
        raise MissingInputError(
            f"{spec}: no such config file {path}; configs/ holds the shipped ones, "
            "e.g. configs/first_run.py or configs/tiny.py:eps8."
        )
    module_spec = importlib.util.spec_from_file_location("dpnmt_config_file", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    config = module.get_config(variant or None)
    for name, value in (overrides or {}).items():
        section, field = name.split(".", 1)
        config[section][field] = value
    return config
