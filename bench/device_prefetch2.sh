#!/usr/bin/env bash
# Zero-copy gather capped at 1 block/SM (was 4): sampled training with and without prefetch,
# host and store tiers, F = 1024 and F = 100, P = 1 and P = all GPUs (3 interleaved rounds).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/device_env.sh
LOGS=/tmp/mgg-logs; mkdir -p "$LOGS"
timeout 60 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/gpu/test_sample_gpu.py -k "gather or prefetch" \
  > "$LOGS/sample-tests-P1.log" 2>&1
grep -E "^(FAILED|E  )|passed|failed" "$LOGS/sample-tests-P1.log" | tail -6
RUNS=host,host+noprefetch,store,store+noprefetch
for F in 1024 0; do
  timeout 150 python3 bench/sampled.py --graph products-like --scale 0.1 --epochs 3 --rounds 3 --no-pyg --runs $RUNS \
    --feat-dim $F --out "$LOGS" > "$LOGS/prefetch-F$F-P1.log" 2>&1
  grep -E "^(mgg|prefetch|row gather)|nodes" "$LOGS/prefetch-F$F-P1.log"
  timeout 150 "${MPI[@]}" -np "$NGPU" python3 bench/sampled.py --graph products-like --scale 0.1 --epochs 3 --rounds 3 \
    --no-pyg --runs $RUNS --feat-dim $F --out "$LOGS" > "$LOGS/prefetch-F$F-P$NGPU.log" 2>&1
  grep -E "^(mgg|prefetch)|nodes" "$LOGS/prefetch-F$F-P$NGPU.log"
done
tar czf "$OUT/logs.tgz" -C "$LOGS" .
