#!/usr/bin/env bash
# The GPU step table (issue 29), on one GPU with no network: the measured bf16
# and f32 matmul peaks (and the card's data-sheet peaks), then per model
# (Multi30K's at its buckets; t5-small- and mT5-small-sized, built from config,
# random weights, no download), dtype, batch (growing until out of memory) and
# mode (non-private `jax`, DP `ghost`, DP `vmap`): step time, tokens/s,
# XLA-counted GFLOP per step, GFLOP/s and MFU against the measured peak; then
# one Multi30K epoch DERIVED from the measured bucket steps, and the paper's
# WMT-16 epoch (mT5-small, 2 x A100) as examples and tokens per second per GPU.
# See benchmarks/mfu.py for what each column counts.
#
#   bash benchmarks/gpu.sh             # on a GPU (JAX with CUDA installed)
#   bash benchmarks/gpu.sh --tiny      # or SIZE=tiny: a CPU smoke run, tiny models
#
# Environment: PYTHON (default python), MODELS, MODES, DTYPES, BATCHES, SEQS,
# JSON (where the rows go; default /tmp/dpnmt_gpu_table.json).
#
# Time: compilation dominates. On an H100 (2026-11-26, JAX 0.11.2) a step
# program took about a minute to compile, so the full grid (~90 programs) runs
# for about an hour and a half; a short lease gets a few cells, e.g.
#   MODELS=t5-small MODES=jax,ghost DTYPES=bfloat16 BATCHES=128 bash benchmarks/gpu.sh  # ~3.5 min
# Each row is also printed as a JSON line as soon as its cell is measured.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${SIZE:-full}
if [[ ${1:-} == --tiny ]]; then SIZE=tiny; fi
PYTHON=${PYTHON:-python}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
models=${MODELS:-multi30k,t5-small,mt5-small}
modes=${MODES:-jax,ghost,vmap}

if [[ $SIZE == tiny ]]; then
  # float32 only by default: bfloat16 matmuls are slow on most CPUs.
  args=(--tiny --dtypes="${DTYPES:-float32}" --steps=2)
elif [[ $SIZE == full ]]; then
  if ! "$PYTHON" -c 'import jax, sys; sys.exit(jax.devices()[0].platform != "gpu")'; then
    echo "gpu.sh: JAX sees no GPU. Install JAX with CUDA (pip install 'jax[cuda12]')," \
      "or run the CPU smoke size: bash benchmarks/gpu.sh --tiny" >&2
    exit 2
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  args=(--dtypes="${DTYPES:-bfloat16,float32}" --batch_sizes="${BATCHES:-8,16,32,64,128}"
    --seq_lens="${SEQS:-128}" --peak_n=8192 --peak_repeats=20 --steps=10)
else
  echo "gpu.sh: SIZE=$SIZE: use SIZE=full (the default) or SIZE=tiny." >&2
  exit 2
fi
exec "$PYTHON" -m benchmarks.mfu "${args[@]}" --models="$models" --modes="$modes" \
  --epoch --anchor --json="${JSON:-/tmp/dpnmt_gpu_table.json}"
