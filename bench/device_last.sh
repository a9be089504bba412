#!/usr/bin/env bash
# The last open measurements, one device call:
#   1. the sampled-path GPU tests (prefetch included) at P = 1 and P = all GPUs;
#   2. sampled training with and without the side-stream prefetch, store and host tiers, P = 1 and P;
#   3. GAT on reddit-like at P (one strategy for all ranks);
#   4. the tuner alone on reddit-like (3 searches; compare with the saved grid of the same graph).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/device_env.sh
export CI=1
MPI+=(-x CI)
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_sample_gpu.py 2>&1 | tee "$OUT/sample-tests-P1.log" | tail -3
timeout 120 "${MPI[@]}" -np "$NGPU" python3 -m pytest -q -p no:cacheprovider tests/gpu/test_sample_gpu.py 2>&1 \
  | tee "$OUT/sample-tests-P$NGPU.log" | grep -E "passed|failed|FAILED|Error" | tail -4
RUNS=host,host+noprefetch,store,store+noprefetch
timeout 100 python3 bench/sampled.py --graph products-like --scale 0.1 --epochs 3 --no-pyg --runs $RUNS \
  --out "$OUT" 2>&1 | tee "$OUT/sampled-P1.log" | grep -E "^mgg|generated|nodes"
timeout 100 "${MPI[@]}" -np "$NGPU" python3 bench/sampled.py --graph products-like --scale 0.1 --epochs 3 --no-pyg \
  --runs $RUNS --out "$OUT" 2>&1 | tee "$OUT/sampled-P$NGPU.log" | grep -E "^mgg|nodes"
timeout 70 "${MPI[@]}" -np "$NGPU" python3 bench/gat.py --no-pyg --graphs reddit-like --scale-reddit 0.1 --epochs 5 \
  --out "$OUT" 2>&1 | tee "$OUT/gat-reddit-P$NGPU.log" | grep -E "mgg|generated"
timeout 150 "${MPI[@]}" -np "$NGPU" python3 bench/tune_grid.py --graph reddit-like --scale 1 --dim 16 --no-grid \
  --variants pipelined --tuner-runs 3 --out "$OUT" 2>&1 | tee "$OUT/tune-reddit.log" | grep -E "^(tuner|log)"
