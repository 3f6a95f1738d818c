"""A `Lot` (one logical batch of examples) and how examples are collated into one.

Privacy note: the size of a Poisson lot is private. `Lot.__repr__` hides it.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from dpnmt.bridge.dataset import INDEX, ExampleBlock

INDEX_DTYPE = np.int64


@dataclasses.dataclass(frozen=True, repr=False)
class Lot:
    """One logical batch: the sampled example indices and their fields.

    Attributes:
      indices: `[n]` int64 dataset positions of the sampled examples (n may be 0).
      batch: field name -> `[n, ...]` numpy array, rows aligned with `indices`.
    """

    indices: np.ndarray
    batch: dict[str, np.ndarray]

    def __repr__(self) -> str:
        """Names the fields only: a Poisson lot's size is private, never print it."""
        return f"Lot(fields={sorted(self.batch)}, size=<private>)"


class LotCollator:
    """Collates a list of per-example dicts into a `Lot`, including the empty lot.

    Replaces Opacus' empty-batch collate, which fails for dict-of-numpy samples
    (it needs tensors, or passes a Python type as a torch dtype). An empty list
    gives a `Lot` with zero rows and the right per-field shapes and dtypes.
    """

    def __init__(self, field_specs: Mapping[str, tuple[tuple[int, ...], np.dtype]]):
        """Stores the per-example field layout.

        Args:
          field_specs: field name -> (per-example shape, dtype), without `index`
            (e.g. `TokenizedExamples.field_specs()`).
        """
        self._field_specs = {
            name: (tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in field_specs.items()
        }

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> Lot:
        """Stacks `samples` (each with an `index` and every field) into a `Lot`.

        Args:
          samples: per-example dicts (or an `ExampleBlock`); may be empty.

        Returns:
          A `Lot` with `[n]` indices and `[n, *shape]` arrays of the spec dtypes.

        Raises:
          ValueError: a field's per-example shape differs from its spec.
        """
        if isinstance(samples, ExampleBlock):
            indices = samples.indices.astype(INDEX_DTYPE)
        else:
            indices = np.fromiter((int(s[INDEX]) for s in samples), INDEX_DTYPE, count=len(samples))
        batch = {}
        for name, (shape, dtype) in self._field_specs.items():
            if isinstance(samples, ExampleBlock):
                stacked = samples.fields[name].astype(dtype, copy=False)
            elif len(samples):
                stacked = np.stack([np.asarray(s[name], dtype=dtype) for s in samples])
            else:
                stacked = np.zeros((0, *shape), dtype=dtype)
            if stacked.shape[1:] != shape:
                raise ValueError(
                    f"field {name!r} has per-example shape {stacked.shape[1:]}, expected "
                    f"{shape}; pad examples to the fixed length before collating."
                )
            batch[name] = stacked
        return Lot(indices=indices, batch=batch)


def fetch_examples(dataset: torch.utils.data.Dataset, indices: np.ndarray) -> Sequence[Any]:
    """The examples at `indices`, batched when the dataset supports it (as torch does)."""
    if hasattr(dataset, "__getitems__"):
        return dataset.__getitems__(indices.tolist())
    return [dataset[int(i)] for i in indices]
