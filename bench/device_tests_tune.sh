#!/usr/bin/env bash
# One device call: every GPU test (P = 1 and all GPUs), then the tuner against the exhaustive grid
# (products-like and reddit-like, P = all GPUs, 5 independent searches each). Logs under $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/device_env.sh
export CI=1
MPI+=(-x CI)
t=$(date +%s)
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/gpu-tests-P1.log" | tail -12
echo "P=1 tests: $(( $(date +%s) - t )) s"; t=$(date +%s)
timeout 240 "${MPI[@]}" -np "$NGPU" python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/gpu-tests-P$NGPU.log" | grep -E "passed|failed|FAILED|Error" | tail -12
echo "P=$NGPU tests: $(( $(date +%s) - t )) s"
for g in products-like reddit-like; do
  echo "== tuner vs grid, $g, P=$NGPU"
  timeout 130 "${MPI[@]}" -np "$NGPU" python3 bench/tune_grid.py --graph "$g" --scale 1 --dim 16 \
    --variants pipelined --tuner-runs 5 --out "$OUT" 2>&1 | tee "$OUT/tune-grid-$g.log" | grep -v "^grid [0-9]" | tail -4
done
