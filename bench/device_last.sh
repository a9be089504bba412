#!/usr/bin/env bash
# The last open measurements, one device call (all logs in one archive: the tool returns <= 8 files):
#   1. the sampled-path GPU tests (prefetch included) at P = 1 and P = all GPUs (per-rank output);
#   2. sampled training with and without the two-stream prefetch, host and store tiers, P = 1 and P;
#   3. the tuner alone on reddit-like (3 searches), scored against the saved grid of the same graph
#      (the aggregation kernels are unchanged since it was measured).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/device_env.sh
export CI=1
MPI+=(-x CI)
sample_tests sample-tests all
sampled_bench sampled 100 --epochs 5 --runs host,host+noprefetch,store,store+noprefetch
timeout 150 "${MPI[@]}" -np "$NGPU" python3 bench/tune_grid.py --graph reddit-like --scale 1 --dim 16 --no-grid \
  --grid-from bench/results/tune-grid-reddit-like-P2-20261123-030756.json --variants pipelined --tuner-runs 3 \
  --out "$LOGS" > "$LOGS/tune-reddit.log" 2>&1; grep -E "^(tuner|log)" "$LOGS/tune-reddit.log"
tar czf "$OUT/logs.tgz" -C "$LOGS" .
