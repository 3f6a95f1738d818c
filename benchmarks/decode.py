"""Decoding throughput: our jit-compiled greedy / beam search vs transformers' generate.

Both run the same randomly initialised mT5-style model (converted weights) on
CPU and produce the same tokens; prints sentences/s per setting.

    python benchmarks/decode.py --batch_size=32 --repeats=3

"same tokens" counts sentences whose tokens equal transformers' output.
Decoding starts with an untimed call (compile for JAX, warm-up for torch).

With --workdir (a COPY of a finished training run: nothing is written there),
it instead times decoding a split of that run as `python -m dpnmt.decode`
does (the same batches, `eval.max_new_tokens`, length penalty), greedy and
each --beams setting side by side in one process, and prints the wall time
of each with its ratio to greedy:

    python benchmarks/decode.py --workdir=/tmp/run_copy --beams=1,5 --eval_batch_size=64

"same as run" says whether the hypotheses equal the run's own
`decode_<split>/hypotheses.<split>.txt` (written by its last decode).
"""

import os
import statistics
import time

import jax
import numpy as np
import torch
import transformers
from absl import app, flags

from dpnmt.evaluation import decode as decode_lib
from dpnmt.evaluation.translate import translate
from dpnmt.models import convert, decoding
from dpnmt.models.config import from_hf_config
from dpnmt.models.factory import create_model
from dpnmt.training import pieces

_BATCH = flags.DEFINE_integer("batch_size", 32, "Sentences per generate call.")
_SRC_LEN = flags.DEFINE_integer("src_len", 32, "Source tokens per sentence.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 32, "Generated tokens per sentence.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per setting (median reported).")
_D_MODEL = flags.DEFINE_integer("d_model", 256, "Model width.")
_LAYERS = flags.DEFINE_integer("layers", 4, "Encoder and decoder layers.")
_VOCAB = flags.DEFINE_integer("vocab_size", 8192, "Vocabulary size.")
_WORKDIR = flags.DEFINE_string("workdir", None, "A copy of a trained run: time its decoding.")
_SPLIT = flags.DEFINE_enum("split", "test", ["validation", "test"], "Split (--workdir).")
_BEAMS = flags.DEFINE_list("beams", ["1", "5"], "num_beams settings to time (--workdir).")
_EVAL_BATCH = flags.DEFINE_integer(
    "eval_batch_size", None, "Sentences per generate call (--workdir; default eval.batch_size)."
)
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


def _decode_run(workdir, split, beams, batch_size):
    """Times translating a run's split per num_beams; prints a table."""
    run = decode_lib.load_run_config(workdir)
    corpus = pieces.load_corpus(run.data)
    tokenizer, _ = pieces.build_tokenizer(run, corpus, workdir, noise_seed=None, learn=False)
    tokenized, _ = pieces.tokenize_corpus(run, corpus, tokenizer)
    _, model, model_config, params, _, _ = decode_lib.load_trained(run, workdir)
    sources = [list(row) for row in tokenized[split]["input_ids"]]
    limit = run.data.max_test_examples if split == "test" else run.data.max_eval_examples
    sources = sources[:limit] if limit else sources
    batch_size = batch_size or run.eval.batch_size
    saved = os.path.join(workdir, f"decode_{split}", f"hypotheses.{split}.txt")
    saved = open(saved, encoding="utf-8").read().splitlines() if os.path.exists(saved) else None
    print(
        f"run: {run.model.num_layers}+{run.model.num_decoder_layers} layers, d_model "
        f"{run.model.d_model}, vocab {model_config.vocab_size}; {split}: {len(sources)} "
        f"sentences, batch {batch_size}, max_new_tokens {run.eval.max_new_tokens}, "
        f"length_penalty {run.eval.length_penalty}; jax devices={jax.devices()}"
    )
    header = f"{'setting':<10} {'compile s':>10} {'decode s':>9} {'sent/s':>8} {'x greedy':>9}"
    print(header + " same as run")
    greedy_s = None
    for num_beams in beams:
        gen = decoding.from_model_config(
            model_config,
            run.eval.max_new_tokens,
            num_beams=num_beams,
            length_penalty=run.eval.length_penalty,
        )

        def go(rows, gen=gen):
            return translate(
                model,
                params,
                tokenizer,
                rows,
                gen=gen,
                batch_size=batch_size,
                max_source_length=run.data.max_source_length,
                show_progress=False,
            )

        start = time.perf_counter()
        go(sources[:1])  # compiles: every batch has the same shape
        compile_s = time.perf_counter() - start
        start = time.perf_counter()
        hypotheses = go(sources)
        seconds = time.perf_counter() - start
        greedy_s = seconds if num_beams == 1 else greedy_s
        ratio = f"{seconds / greedy_s:.2f}" if greedy_s else "-"
        same = "-"
        if saved is not None and num_beams == run.eval.num_beams:
            same = str([" ".join(h.splitlines()) for h in hypotheses] == saved)
        name = "greedy" if num_beams == 1 else f"beam {num_beams}"
        rate = len(sources) / seconds
        print(f"{name:<10} {compile_s:>10.1f} {seconds:>9.1f} {rate:>8.1f} {ratio:>9} {same}")


def main(argv):
    del argv
    if _WORKDIR.value:
        _decode_run(_WORKDIR.value, _SPLIT.value, [int(b) for b in _BEAMS.value], _EVAL_BATCH.value)
        return
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
