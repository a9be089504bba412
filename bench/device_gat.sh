#!/usr/bin/env bash
# One device call for the fused GAT path and the embedding service on the GPU:
# GAT GPU tests (P = 1, all GPUs), the node/edge crossover sweep, GAT vs PyG (epoch, peak memory)
# at P = 1 and the P-scaling, the DLRM example and the service load test on the GPU.
# Each stage is time-boxed; logs under $OUT, a short summary last.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/device_env.sh
export CI=1
MPI+=(-x CI)
SP="${GAT_SCALE_PRODUCTS:-0.25}" SR="${GAT_SCALE_REDDIT:-0.1}"
echo "== build"
timeout 120 python3 -c "from mgg.kernels.gat_gpu import build; print(build())" 2>&1 | tail -2
echo "== GAT GPU tests P=1"
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_gat_gpu.py 2>&1 | tee "$OUT/gat-tests-P1.log" | tail -15
echo "== GAT GPU tests P=$NGPU"
timeout 150 "${MPI[@]}" -np "$NGPU" python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_gat_gpu.py 2>&1 | tee "$OUT/gat-tests-P$NGPU.log" | tail -6
echo "== node/edge crossover"
timeout 120 python3 bench/gat_threshold.py --out "$OUT" 2>&1 | tee "$OUT/gat-threshold.log" | tail -12
echo "== GAT vs PyG, P=1"
timeout 150 python3 bench/gat.py --scale-products "$SP" --scale-reddit "$SR" --epochs 5 --out "$OUT" 2>&1 | tee "$OUT/gat-P1.log" | tail -8
echo "== GAT P=$NGPU"
timeout 120 "${MPI[@]}" -np "$NGPU" python3 bench/gat.py --no-pyg --scale-products "$SP" --scale-reddit "$SR" --epochs 5 --out "$OUT" 2>&1 | tee "$OUT/gat-P$NGPU.log" | tail -6
python3 bench/gat.py --summarize "$OUT"/gat-*.json 2>&1 | tail -8
echo "== DLRM on the GPU"
timeout 60 "${MPI[@]}" -np "$NGPU" python3 examples/dlrm.py --backend gpu --steps 50 2>&1 | tee "$OUT/dlrm-gpu.log" | tail -4
echo "== embedding service on the GPU"
timeout 90 python3 bench/embedding.py --mode serve --backend gpu --np "$NGPU" --out "$OUT" 2>&1 | tee "$OUT/serve-gpu.log" | tail -3
