"""Decoding throughput: our jit-compiled greedy / beam search vs transformers' generate.

Both run the same randomly initialised mT5-style model (converted weights) on
CPU and produce the same tokens; prints sentences/s per setting.

    python benchmarks/decode.py --batch_size=32 --repeats=3

"same tokens" counts sentences whose tokens equal transformers' output.
Decoding starts with an untimed call (compile for JAX, warm-up for torch).
"""

import statistics
import time

import jax
import numpy as np
import torch
import transformers
from absl import app, flags

from dpnmt.models import convert, decoding
from dpnmt.models.config import from_hf_config
from dpnmt.models.factory import create_model

_BATCH = flags.DEFINE_integer("batch_size", 32, "Sentences per generate call.")
_SRC_LEN = flags.DEFINE_integer("src_len", 32, "Source tokens per sentence.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 32, "Generated tokens per sentence.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per setting (median reported).")
_D_MODEL = flags.DEFINE_integer("d_model", 256, "Model width.")
_LAYERS = flags.DEFINE_integer("layers", 4, "Encoder and decoder layers.")
_VOCAB = flags.DEFINE_integer("vocab_size", 8192, "Vocabulary size.")
_TORCH_THREADS = flags.DEFINE_integer(
    "torch_threads", 1, "torch intra-op threads (0: torch default; >1 fights XLA for few cores)."
)


def _median_seconds(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv):
    del argv
    if _TORCH_THREADS.value:
        torch.set_num_threads(_TORCH_THREADS.value)
    torch.manual_seed(0)
    hf_config = transformers.MT5Config(
        vocab_size=_VOCAB.value,
        d_model=_D_MODEL.value,
        d_kv=_D_MODEL.value // 8,
        d_ff=4 * _D_MODEL.value,
        num_layers=_LAYERS.value,
        num_heads=8,
    )
    hf = transformers.MT5ForConditionalGeneration(hf_config).eval()
    hf.lm_head.weight = torch.nn.Parameter(torch.randn_like(hf.lm_head.weight))
    config = from_hf_config(hf_config)
    params = jax.device_put(convert.convert_state_dict(hf.state_dict(), config))
    model = create_model(config)

    rng = np.random.default_rng(0)
    shape = (_BATCH.value, _SRC_LEN.value)
    ids = rng.integers(2, _VOCAB.value, shape)
    mask = np.ones(shape, np.int64)
    for row in range(_BATCH.value):  # varied lengths, as in real batches
        mask[row, rng.integers(_SRC_LEN.value // 2, _SRC_LEN.value + 1) :] = 0
    ids_t, mask_t = torch.tensor(ids), torch.tensor(mask)

    print(
        f"model: mT5-style d_model={_D_MODEL.value} layers={_LAYERS.value}+{_LAYERS.value} "
        f"vocab={_VOCAB.value}; batch={_BATCH.value} src_len={_SRC_LEN.value} "
        f"max_new_tokens={_MAX_NEW.value}; jax devices={jax.devices()}; "
        f"torch threads={torch.get_num_threads()}"
    )
    print(f"{'setting':<10} {'impl':<22} {'compile s':>10} {'sent/s':>10} {'same tokens':>12}")
    for num_beams in (1, 4):
        gen = decoding.from_model_config(config, _MAX_NEW.value, num_beams=num_beams)
        fn = decoding.make_generate_fn(model, gen)
        start = time.perf_counter()
        ours, _ = jax.block_until_ready(fn(params, ids, mask))
        compile_s = time.perf_counter() - start
        ours_s = _median_seconds(
            lambda fn=fn: jax.block_until_ready(fn(params, ids, mask)), _REPEATS.value
        )

        def hf_generate(num_beams=num_beams):
            with torch.no_grad():
                return hf.generate(
                    input_ids=ids_t,
                    attention_mask=mask_t,
                    num_beams=num_beams,
                    max_new_tokens=_MAX_NEW.value,
                    do_sample=False,
                    decoder_start_token_id=config.decoder_start_token_id,
                    length_penalty=1.0,
                    early_stopping=False,
                ).numpy()[:, 1:]

        reference = hf_generate()
        hf_s = _median_seconds(hf_generate, _REPEATS.value)
        ours = np.asarray(ours)[:, : reference.shape[1]]
        same = int(np.sum(np.all(ours == reference, axis=1)))
        name = "greedy" if num_beams == 1 else f"beam {num_beams}"
        rate = _BATCH.value / ours_s
        agree = f"{same}/{_BATCH.value}"
        print(f"{name:<10} {'dpnmt (jax.jit)':<22} {compile_s:>10.1f} {rate:>10.1f} {agree:>12}")
        print(f"{name:<10} {'transformers generate':<22} {'-':>10} {_BATCH.value / hf_s:>10.1f}")


if __name__ == "__main__":
    app.run(main)
