#!/usr/bin/env bash
# Sampled training with and without the loader's two-stream prefetch (host and store tiers), at
# the preset's F = 100 and at F = 1024 (10x the bytes per row), P = 1 and P = all GPUs; runs
# interleaved over 3 rounds, medians. Also the raw row-gather bandwidth (host tier vs GPU memory).
# First the sampled-path GPU tests at P = 1 and P = all GPUs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/device_env.sh
LOGS=/tmp/mgg-logs; mkdir -p "$LOGS"
export CI=1
MPI+=(-x CI)
timeout 120 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/gpu/test_sample_gpu.py > "$LOGS/sample-tests-P1.log" 2>&1
grep -E "^(FAILED|E  )|passed|failed" "$LOGS/sample-tests-P1.log" | tail -12
timeout 150 "${MPI[@]}" -np "$NGPU" --output-filename "$LOGS/sample-tests-P$NGPU" python3 -m pytest -q -p no:cacheprovider \
  -rf --tb=short tests/gpu/test_sample_gpu.py > /dev/null 2>&1
grep -rhE "^(FAILED|E  )|passed|failed" "$LOGS/sample-tests-P$NGPU" | head -20
RUNS=host,host+noprefetch,store,store+noprefetch
for F in 0 1024; do
  timeout 150 python3 bench/sampled.py --graph products-like --scale 0.1 --epochs 3 --rounds 3 --no-pyg --runs $RUNS \
    --feat-dim $F --out "$LOGS" > "$LOGS/prefetch-F$F-P1.log" 2>&1
  grep -E "^(mgg|prefetch|row gather)|nodes" "$LOGS/prefetch-F$F-P1.log"
  timeout 150 "${MPI[@]}" -np "$NGPU" python3 bench/sampled.py --graph products-like --scale 0.1 --epochs 3 --rounds 3 \
    --no-pyg --runs $RUNS --feat-dim $F --out "$LOGS" > "$LOGS/prefetch-F$F-P$NGPU.log" 2>&1
  grep -E "^(mgg|prefetch)|nodes" "$LOGS/prefetch-F$F-P$NGPU.log"
done
tar czf "$OUT/logs.tgz" -C "$LOGS" .
