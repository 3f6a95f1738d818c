"""Length buckets through the DP lot step (`training.make_lot_step`, what `dpnmt.train` runs).

A lot cut into bucketed micro-batches (rows grouped by length, each cropped to
its bucket) releases the same clipped gradient sum as the same lot padded to
the max lengths, on a tiny from-scratch T5 with dropout off; padding rows of a
bucketed micro-batch contribute exactly zero; the config check names the field.
"""

import types

import jax
import numpy as np
import optax
import pytest

from dpnmt import bridge, config_lib, core, training
from dpnmt.bridge.dataset import INPUT_IDS, LABELS
from dpnmt.config import RunConfig
from dpnmt.training import pieces, preflight, run_dir
from tests.small_configs import small_plan, tiny_model_config

MAX_SOURCE, MAX_TARGET, PAD, EOS, VOCAB = 24, 20, 0, 1, 40
PHYSICAL_BATCH = 4
BUCKETS = bridge.LengthBuckets.from_lengths((8, 24), MAX_SOURCE, MAX_TARGET)


def _pairs(num_examples, seed=0):
    """Random pairs ending in EOS, most short, a few near the max lengths."""
    rng = np.random.default_rng(seed)

    def rows(max_length):
        lengths = np.minimum(rng.geometric(0.12, num_examples) + 1, max_length)
        return [[*rng.integers(2, VOCAB, n - 1), EOS] for n in lengths]

    return bridge.TokenizedExamples(
        rows(MAX_SOURCE),
        rows(MAX_TARGET),
        max_source_length=MAX_SOURCE,
        max_target_length=MAX_TARGET,
        pad_id=PAD,
    )


@pytest.fixture(scope="module")
def tiny():
    config = tiny_model_config()
    config.model.dropout_rate = 0.0  # Dropout off: the same sum whatever the row order.
    tokenizer = types.SimpleNamespace(vocab_size=VOCAB, pad_id=PAD, eos_id=EOS)
    model, model_config, params = pieces.build_model(
        RunConfig.of(config).model, tokenizer, jax.random.key(0)
    )
    # Clip 0.1, below the per-example norms: clipping is active.
    plan = small_plan(sigma=1.0, clip=0.1, lot_size=12, steps_per_epoch=8)
    mesh = bridge.make_data_mesh(jax.devices()[:1])
    steps = training.make_lot_step(
        lambda p, example, key: training.example_loss(model, model_config, p, example, key),
        optax.sgd(1.0),
        training.StepPrivacy.from_plan(plan),
        mesh,
    )
    return types.SimpleNamespace(params=params, steps=steps, mesh=mesh, plan=plan)


def _rows(dataset, short: bool, count: int) -> list[int]:
    """`count` rows that fit bucket (8, 8) (short) or do not."""
    source, target = dataset.lengths(np.arange(len(dataset)))
    fits = np.maximum(source, target) <= 8
    rows = np.flatnonzero(fits if short else ~fits)
    assert rows.size >= count
    return rows[:count].tolist()


def _microbatches(tiny, dataset, lot, buckets):
    with bridge.device_lots(
        [lot],
        tiny.mesh,
        PHYSICAL_BATCH,
        pad_values=dataset.pad_values,
        rows_from=dataset,
        length_buckets=buckets,
    ) as prefetched:
        return next(prefetched)


def _grad_sum(tiny, microbatches):
    acc = core.init_accumulator(tiny.params)
    for index, micro in enumerate(microbatches):
        key = jax.random.key(index)
        acc, _ = tiny.steps.add_microbatch(acc, tiny.params, {}, micro, key)
    return jax.device_get(acc)


def test_bucketed_lot_has_the_same_clipped_gradient_sum(tiny):
    dataset = _pairs(60)
    # An index-only lot, as the trainer samples it: 14 rows, 4 micro-batches.
    short, long = _rows(dataset, True, 9), _rows(dataset, False, 5)
    mixed = [row for pair in zip(short, long + [None] * 4, strict=True) for row in pair]
    lot = bridge.Lot(np.array([row for row in mixed if row is not None]), {})
    full = _microbatches(tiny, dataset, lot, None)
    bucketed = _microbatches(tiny, dataset, lot, BUCKETS)
    shapes = [(m[INPUT_IDS].shape[1], m[LABELS].shape[1]) for m in bucketed]
    assert len(bucketed) == len(full) == 4
    assert (8, 8) in shapes and (MAX_SOURCE, MAX_TARGET) in shapes  # Both buckets used.
    want, got = _grad_sum(tiny, full), _grad_sum(tiny, bucketed)
    assert int(got.num_examples) == int(want.num_examples) == 14
    jax.tree.map(
        lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7),
        got.grad_sum,
        want.grad_sum,
    )
    # Not vacuous: every clipped example moved the sum (norm near 14 C).
    norm = float(core.per_example_l2_norms(jax.tree.map(lambda g: g[None], got.grad_sum))[0])
    assert norm > 0.5 * tiny.plan.l2_clip


def test_padding_rows_of_a_bucketed_microbatch_contribute_exactly_zero(tiny):
    dataset = _pairs(60)
    lot = bridge.Lot(np.array(_rows(dataset, True, 5)), {})  # Short rows: bucket (8, 8).
    last = _microbatches(tiny, dataset, lot, BUCKETS)[-1]
    mask = np.asarray(last[bridge.MASK])
    assert mask.tolist() == [1, 0, 0, 0] and last[INPUT_IDS].shape[1] == 8
    # The masked rows now hold real tokens and lengths: still exactly zero.
    filled = {name: np.asarray(values).copy() for name, values in last.items()}
    filled[INPUT_IDS][1:] = 7
    filled[LABELS][1:] = 9
    filled["input_length"][1:] = filled["label_length"][1:] = 8
    filled = bridge.shard_microbatch(filled, tiny.mesh)
    for got, want in zip(
        jax.tree.leaves(_grad_sum(tiny, [filled])),
        jax.tree.leaves(_grad_sum(tiny, [last])),
        strict=True,
    ):
        np.testing.assert_array_equal(got, want)


def test_config_check_names_the_field_and_the_fix():
    config = config_lib.base_config()
    assert config.data.length_buckets == "auto"
    assert not [p for p in preflight.config_problems(RunConfig.of(config)) if "length_buckets" in p]
    config.data.length_buckets = "16,32"  # Below max_source_length = 64.
    (problem,) = [
        p for p in preflight.config_problems(RunConfig.of(config)) if "length_buckets" in p
    ]
    assert problem.startswith("data.length_buckets='16,32'") and "end the list with 64" in problem
    config.data.length_buckets = "16,64"
    config.data.tokenize_train = "per_lot"
    (problem,) = [
        p for p in preflight.config_problems(RunConfig.of(config)) if "length_buckets" in p
    ]
    assert "data.tokenize_train='upfront'" in problem and "data.length_buckets='none'" in problem
    config.data.length_buckets = "auto"  # Auto: off per lot, not an error.
    assert not [p for p in preflight.config_problems(RunConfig.of(config)) if "length_buckets" in p]
    assert "data.length_buckets" in run_dir.NOT_BINDING_FIELDS  # A resume may change it.
