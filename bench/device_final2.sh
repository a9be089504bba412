#!/usr/bin/env bash
# One device call: tuner vs exhaustive grid (products-like, reddit-like; 3 independent searches
# each), GAT on reddit-like at P = all GPUs, and the PyG SAGEConv sampled baseline at P = 1.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/device_env.sh
export CI=1
MPI+=(-x CI)
for g in products-like:150 reddit-like:170; do
  echo "== tuner vs grid, ${g%%:*}, P=$NGPU"
  timeout "${g##*:}" "${MPI[@]}" -np "$NGPU" python3 bench/tune_grid.py --graph "${g%%:*}" --scale 1 --dim 16 \
    --variants pipelined --tuner-runs 3 --out "$OUT" 2>&1 | tee "$OUT/tune-grid-${g%%:*}.log" | grep -E "^(grid:|tuner)"
done
echo "== GAT reddit-like P=$NGPU"
timeout 120 "${MPI[@]}" -np "$NGPU" python3 bench/gat.py --no-pyg --graphs reddit-like --scale-reddit 0.1 --epochs 5 \
  --out "$OUT" 2>&1 | tee "$OUT/gat-reddit-P$NGPU.log" | grep -E "mgg|generated"
echo "== sampled: PyG SAGEConv baseline, P=1"
timeout 90 python3 bench/sampled.py --graph products-like --scale 0.1 --epochs 2 --runs store --out "$OUT" 2>&1 \
  | tee "$OUT/sampled-pyg-P1.log" | grep -E "^(mgg|pyg|id map)"
