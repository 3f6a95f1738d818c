"""Save and restore a parameter pytree with orbax."""

from __future__ import annotations

import os

import chex
import jax
import orbax.checkpoint as ocp


def save_params(directory: str | os.PathLike, params: chex.ArrayTree) -> None:
    """Writes `params` to `directory` (must not exist yet); blocks until done.

    Args:
        directory: Absolute or relative path of a new checkpoint directory.
        params: Pytree of arrays.
    """
    directory = os.path.abspath(directory)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(directory, params)
        checkpointer.wait_until_finished()


def load_params(directory: str | os.PathLike, like: chex.ArrayTree | None = None) -> chex.ArrayTree:
    """Reads params written by `save_params`.

    Args:
        directory: The checkpoint directory.
        like: Optional pytree of arrays or `jax.ShapeDtypeStruct`s giving the
            structure, dtypes and shardings to restore into (e.g.
            `factory.abstract_params(model)`); None restores as saved.

    Returns:
        The params pytree.
    """
    directory = os.path.abspath(directory)
    if like is not None:
        like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), like)
    with ocp.StandardCheckpointer() as checkpointer:
        return checkpointer.restore(directory, like)
