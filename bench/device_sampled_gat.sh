#!/usr/bin/env bash
# One device call: sampled mini-batch training (bench/sampled.py at P = 1 with PyG and at P = all
# GPUs; Table-3-style full-graph vs sampled accuracy through the CLI) and the GAT benchmark
# (PyG at P = 1, our P-scaling). Each stage time-boxed; logs under $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/device_env.sh
export CI=1
MPI+=(-x CI)
DS="${SAMPLED_DATASET:-products-like}" SC="${SAMPLED_SCALE:-0.1}"
echo "== sampled bench P=1 ($DS@$SC)"
timeout 150 python3 bench/sampled.py --graph "$DS" --scale "$SC" --epochs 2 --out "$OUT" 2>&1 | tee "$OUT/sampled-P1.log" | grep -E "^(mgg|pyg|id map|$DS)" 
echo "== sampled bench P=$NGPU"
timeout 120 "${MPI[@]}" -np "$NGPU" python3 bench/sampled.py --graph "$DS" --scale "$SC" --epochs 2 --no-pyg --out "$OUT" 2>&1 | tee "$OUT/sampled-P$NGPU.log" | grep -E "^(mgg|$DS)"
echo "== accuracy: full-graph vs sampled (Table 3 style)"
for run in "1 full" "1 sampled" "$NGPU sampled"; do
  set -- $run
  extra=(--model sage --epochs 100)
  [[ $2 == sampled ]] && extra=(--mode sampled --fanout 25,10 --batch-size 1024 --epochs 8)
  timeout 100 "${MPI[@]}" -np "$1" python3 -m mgg.train --dataset "$DS" --scale "$SC" --backend gpu --no-progress \
    --eval-every 1000 "${extra[@]}" --metrics-json "$OUT/acc-$2-P$1.json" 2>&1 | tee "$OUT/acc-$2-P$1.log" | grep -E "test_acc|median_epoch|sampling:" | sed "s/^/P=$1 $2: /"
done
SP="${GAT_SCALE_PRODUCTS:-0.25}" SR="${GAT_SCALE_REDDIT:-0.1}"
echo "== GAT vs PyG, P=1"
timeout 120 python3 bench/gat.py --scale-products "$SP" --scale-reddit "$SR" --epochs 5 --out "$OUT" 2>&1 | tee "$OUT/gat-P1.log" | grep -E "mgg|pyg"
echo "== GAT P=$NGPU"
timeout 120 "${MPI[@]}" -np "$NGPU" python3 bench/gat.py --no-pyg --scale-products "$SP" --scale-reddit "$SR" --epochs 5 --out "$OUT" 2>&1 | tee "$OUT/gat-P$NGPU.log" | grep -E "mgg|pyg"
