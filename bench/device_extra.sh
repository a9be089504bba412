#!/usr/bin/env bash
# One device call for the pieces beyond the aggregation benchmark: the NVRTC build probe, the
# embedding-lookup benchmark (GPU, P = all GPUs) and the tuner-vs-grid run. Logs under $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/device_env.sh
echo "== NVRTC + nvJitLink build probe"
MGG_KERNEL_BUILD=nvrtc MGG_KERNEL_CACHE=/tmp/kc-nvrtc timeout 180 python3 -c "
from mgg.kernels.build import build_cubin
b = build_cubin('aggregate'); print(b); print(open(b.path + '.json').read())" 2>&1 | tee "$OUT/nvrtc-probe.log" | tail -15
echo "== embedding lookup, GPU, P=$NGPU"
timeout 240 "${MPI[@]}" -np "$NGPU" python3 bench/embedding.py --backend gpu --label GPU --out "$OUT" 2>&1 \
  | tee "$OUT/embedding-gpu.log" | tail -14
echo "== tuner vs grid, products-like, P=$NGPU"
timeout 300 "${MPI[@]}" -np "$NGPU" python3 bench/tune_grid.py --graph products-like --scale 1 --dim 16 \
  --variants pipelined --out "$OUT" 2>&1 | tee "$OUT/tune-grid.log" | tail -8
