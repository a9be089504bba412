#!/usr/bin/env bash
# One device call: tuner vs exhaustive grid (products-like, then reddit-like), a --tune training run
# on the GPU, and the DLRM example on the GPU. Each stage time-boxed; logs under $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/device_env.sh
export CI=1
MPI+=(-x CI)
echo "== tuner vs grid, products-like, P=$NGPU"
timeout 150 "${MPI[@]}" -np "$NGPU" python3 bench/tune_grid.py --graph products-like --scale 1 --dim 16 \
  --variants pipelined --out "$OUT" 2>&1 | tee "$OUT/tune-grid-products.log" | grep -v "^grid [0-9]" | tail -4
echo "== train --tune on the GPU"
timeout 90 "${MPI[@]}" -np "$NGPU" python3 -m mgg.train --dataset products-like --scale 0.2 --backend gpu \
  --tune --tune-cache "$OUT/tuning.json" --tune-log "$OUT/train-tune-log.json" --epochs 40 --no-progress \
  --metrics-json "$OUT/train-tune-metrics.json" 2>&1 | tee "$OUT/train-tune.log" | tail -5
echo "== DLRM on the GPU"
timeout 60 "${MPI[@]}" -np "$NGPU" python3 examples/dlrm.py --backend gpu --steps 50 2>&1 | tee "$OUT/dlrm-gpu.log" | tail -4
echo "== tuner vs grid, reddit-like, P=$NGPU"
timeout 200 "${MPI[@]}" -np "$NGPU" python3 bench/tune_grid.py --graph reddit-like --scale 1 --dim 16 \
  --variants pipelined --out "$OUT" 2>&1 | tee "$OUT/tune-grid-reddit.log" | grep -v "^grid [0-9]" | tail -4
