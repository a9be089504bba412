#!/usr/bin/env bash
# Match-Reorder with the overlap matrix on the GPU: its GPU test, then sampled training with and
# without reorder (store and host tiers), products-like at 0.1, P = 1 and P = all GPUs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/device_env.sh
LOGS=/tmp/mgg-logs; mkdir -p "$LOGS"
timeout 90 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/gpu/test_sample_gpu.py -k "overlap or prefetch" \
  > "$LOGS/reorder-tests-P1.log" 2>&1
grep -E "^(FAILED|E  )|passed|failed" "$LOGS/reorder-tests-P1.log" | tail -6
RUNS=store,store+reorder,host,host+reorder
timeout 200 python3 bench/sampled.py --graph products-like --scale 0.1 --epochs 3 --rounds 2 --no-pyg --runs $RUNS \
  --out "$LOGS" > "$LOGS/reorder-P1.log" 2>&1
grep -E "^mgg|nodes" "$LOGS/reorder-P1.log"
timeout 200 "${MPI[@]}" -np "$NGPU" python3 bench/sampled.py --graph products-like --scale 0.1 --epochs 3 --rounds 2 \
  --no-pyg --runs $RUNS --out "$LOGS" > "$LOGS/reorder-P$NGPU.log" 2>&1
grep -E "^mgg|nodes" "$LOGS/reorder-P$NGPU.log"
tar czf "$OUT/logs.tgz" -C "$LOGS" .
