#!/usr/bin/env bash
# GAT on reddit-like at P = all GPUs (one strategy for all ranks), then the tuner alone on
# reddit-like (3 searches; compare with the saved grid of the same graph and kernels).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/device_env.sh
export CI=1
MPI+=(-x CI)
timeout 70 "${MPI[@]}" -np "$NGPU" python3 bench/gat.py --no-pyg --graphs reddit-like --scale-reddit 0.1 --epochs 5 \
  --out "$OUT" 2>&1 | tee "$OUT/gat-reddit-P$NGPU.log" | grep -E "mgg|generated"
timeout 110 "${MPI[@]}" -np "$NGPU" python3 bench/tune_grid.py --graph reddit-like --scale 1 --dim 16 --no-grid \
  --variants pipelined --tuner-runs 3 --out "$OUT" 2>&1 | tee "$OUT/tune-reddit.log" | grep -E "^(tuner|log)"
