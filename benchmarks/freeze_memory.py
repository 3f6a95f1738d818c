"""Memory of a DP gradient step with and without freezing (per-example grads).

Per-example gradients are taken only w.r.t. the trainable part of
`split_params`; this prints, per freezing spec, the trainable parameter count
and XLA's compiled memory for one step (vmap(grad) -> clip each example ->
sum), as reported by `compiled.memory_analysis()` on this CPU.

    python benchmarks/freeze_memory.py --batch_size=16
"""

import jax
import jax.numpy as jnp
import optax
from absl import app, flags

from dpnmt.models import partition
from dpnmt.models.config import T5Config
from dpnmt.models.factory import create_model, init_params

_BATCH = flags.DEFINE_integer("batch_size", 16, "Examples per step.")
_SRC_LEN = flags.DEFINE_integer("src_len", 32, "Source tokens.")
_TGT_LEN = flags.DEFINE_integer("tgt_len", 32, "Target tokens.")
_D_MODEL = flags.DEFINE_integer("d_model", 256, "Model width.")
_LAYERS = flags.DEFINE_integer("layers", 4, "Encoder and decoder layers.")
_VOCAB = flags.DEFINE_integer(
    "vocab_size", 32128, "Vocabulary size (mT5-like embeddings dominate)."
)

SPECS = {
    "all": lambda path, _: True,
    "all_but_embeddings": partition.all_but_embeddings,
    "cross_attention_only": partition.cross_attention_only,
}


def _step_fn(model, frozen, l2_clip=1.0):
    def loss(trainable, ids, mask, labels):
        params = partition.merge_params(trainable, frozen)
        logits = model.apply({"params": params}, ids[None], mask[None], labels[None])
        return optax.softmax_cross_entropy_with_integer_labels(logits[0], labels).mean()

    def step(trainable, ids, mask, labels):
        grads = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0, 0))(trainable, ids, mask, labels)
        norms = jnp.sqrt(
            sum(jnp.sum(g.reshape(g.shape[0], -1) ** 2, 1) for g in jax.tree.leaves(grads))
        )
        factor = jnp.minimum(1.0, l2_clip / (norms + 1e-12))
        return jax.tree.map(lambda g: jnp.tensordot(factor, g, axes=1), grads)

    return jax.jit(step)


def main(argv):
    del argv
    config = T5Config(
        model_type="mt5",
        vocab_size=_VOCAB.value,
        d_model=_D_MODEL.value,
        d_kv=_D_MODEL.value // 8,
        d_ff=4 * _D_MODEL.value,
        num_layers=_LAYERS.value,
        num_decoder_layers=_LAYERS.value,
        num_heads=8,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        scale_decoder_outputs=False,
    )
    model = create_model(config)
    params = init_params(model, jax.random.key(0))
    batch = _BATCH.value
    ids = jnp.ones((batch, _SRC_LEN.value), jnp.int32)
    mask = jnp.ones((batch, _SRC_LEN.value), jnp.int32)
    labels = jnp.ones((batch, _TGT_LEN.value), jnp.int32)
    total = sum(p.size for p in jax.tree.leaves(params))
    print(
        f"mT5-style d_model={_D_MODEL.value} layers={_LAYERS.value}+{_LAYERS.value} "
        f"vocab={_VOCAB.value}: {total / 1e6:.1f}M params; batch={batch}"
    )
    print(f"{'trainable':<22} {'params (M)':>10} {'per-ex grads MiB':>17} {'XLA temp MiB':>13}")
    for name, spec in SPECS.items():
        trainable, frozen = partition.split_params(params, spec)
        count = sum(p.size for p in jax.tree.leaves(trainable))
        compiled = _step_fn(model, frozen).lower(trainable, ids, mask, labels).compile()
        temp = compiled.memory_analysis().temp_size_in_bytes
        per_example = batch * count * 4
        print(f"{name:<22} {count / 1e6:>10.2f} {per_example / 2**20:>17.1f} {temp / 2**20:>13.1f}")


if __name__ == "__main__":
    app.run(main)
