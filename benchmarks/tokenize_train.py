"""Up-front vs per-lot tokenization of the train split (`data.tokenize_train`).

On the WMT de-en sample (`$DPNMT_DATA_DIR/wmt_sample_de_en`, 10,000 pairs), a
T5-style SentencePiece vocabulary learnt from its public newstest side, times:
  * up front: `preprocess` of the whole split (what every process did before);
  * per lot: the one text pass of `preprocess_on_demand` (finds N), then fetching
    lots of L rows through `TokenizedOnDemand` vs `TokenizedExamples`.
It prints rows/s and the start-up cost extrapolated to WMT-16's 4.55M pairs,
against the per-lot cost one process pays over an epoch on P processes.
Measured side by side in one run; never a timed test.

Run: DPNMT_DATA_DIR=../shared/data python -m benchmarks.tokenize_train [--lot_size=256]
"""

import argparse
import os
import tempfile
import time

import datasets
import numpy as np

from dpnmt.bridge import TokenizedExamples, TokenizedOnDemand
from dpnmt.data import corpora, preprocess, tokenizers

WMT16_PAIRS = 4_551_054


def _seconds(function, repeats: int = 1):
    """(median seconds of `function()`, its last result)."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return float(np.median(times)), result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lot_size", type=int, default=256, help="L, rows fetched per lot.")
    parser.add_argument("--lots", type=int, default=20, help="Lots fetched per mode.")
    parser.add_argument("--max_length", type=int, default=64, help="Max source/target ids.")
    parser.add_argument("--processes", type=int, default=8, help="P, for the extrapolation.")
    args = parser.parse_args()

    data_dir = os.environ.get("DPNMT_DATA_DIR")
    if not data_dir:
        raise SystemExit("Set DPNMT_DATA_DIR to the shared corpora (e.g. ../shared/data).")
    corpus = corpora.load_corpus("wmt16", "de-en", data_dir=data_dir)
    with tempfile.TemporaryDirectory() as scratch:
        public = os.path.join(scratch, "public.txt")
        with open(public, "w") as f:  # The test split only: public text.
            for row in corpus["test"]["translation"]:
                f.write(f"{row['de']}\n{row['en']}\n")
        tokenizer, _ = tokenizers.train_sentencepiece([public], vocab_size=500)
    options = dict(
        pair="de-en",
        family="t5",
        max_source_length=args.max_length,
        max_target_length=args.max_length,
    )
    train = corpus["train"]
    datasets.disable_progress_bars()
    upfront_s, (tokenized, _) = _seconds(
        lambda: preprocess.preprocess(datasets.DatasetDict({"train": train}), tokenizer, **options)
    )
    scan_s, (on_demand, _) = _seconds(
        lambda: preprocess.preprocess_on_demand(train, tokenizer, **options)
    )
    lengths = dict(max_source_length=args.max_length, max_target_length=args.max_length)
    upfront = TokenizedExamples(
        tokenized["train"]["input_ids"], tokenized["train"]["labels"], **lengths
    )
    lazy = TokenizedOnDemand(on_demand.encode, len(on_demand), **lengths)
    rng = np.random.default_rng(0)
    lots = [np.sort(rng.choice(len(lazy), args.lot_size, replace=False)) for _ in range(args.lots)]
    fetch_upfront, _ = _seconds(lambda: [upfront.__getitems__(lot) for lot in lots])
    fetch_lazy, _ = _seconds(lambda: [lazy.__getitems__(lot) for lot in lots])

    rows = len(train)
    epoch_rows_per_process = WMT16_PAIRS / args.processes
    per_row_lazy = fetch_lazy / (args.lots * args.lot_size)
    table = [
        (
            "up front: preprocess the train split",
            upfront_s,
            rows / upfront_s,
            WMT16_PAIRS / (rows / upfront_s),
        ),
        ("per lot: text pass for N", scan_s, rows / scan_s, WMT16_PAIRS / (rows / scan_s)),
        (
            f"per lot: fetch {args.lots} lots of {args.lot_size}",
            fetch_lazy,
            args.lots * args.lot_size / fetch_lazy,
            epoch_rows_per_process * per_row_lazy,
        ),
        (
            f"up front: fetch {args.lots} lots of {args.lot_size}",
            fetch_upfront,
            args.lots * args.lot_size / fetch_upfront,
            float("nan"),
        ),
    ]
    print(f"train split: {rows:,d} pairs; tokens <= {args.max_length}; L = {args.lot_size}")
    print(f"{'stage':42s} {'seconds':>9s} {'rows/s':>10s} {'WMT-16 s':>10s}")
    for name, seconds, rate, extrapolated in table:
        print(f"{name:42s} {seconds:9.3f} {rate:10.0f} {extrapolated:10.0f}")
    print(
        f"WMT-16 s: start-up seconds on every process for {WMT16_PAIRS:,d} pairs (rows 1-2), "
        f"or the per-lot tokenization one process does in ONE epoch with P = {args.processes} "
        "(row 3: paid again every epoch, in the prefetch thread beside the step)."
    )


if __name__ == "__main__":
    main()
