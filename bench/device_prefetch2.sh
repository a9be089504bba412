#!/usr/bin/env bash
# Zero-copy gather capped at 1 block/SM (was 4): sampled training with and without prefetch,
# host and store tiers, F = 1024 and F = 100, P = 1 and P = all GPUs (3 interleaved rounds).
# (The 4-blocks/SM run, bench/results/session4-h200x2/prefetch-b4/, came from the same steps
# with the kernel's cap at 4, at commit 842b61d.)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/device_env.sh
sample_tests sample-tests one -k "gather or prefetch"
for F in 1024 0; do
  sampled_bench "prefetch-F$F" 150 --epochs 3 --rounds 3 --runs host,host+noprefetch,store,store+noprefetch --feat-dim $F
done
tar czf "$OUT/logs.tgz" -C "$LOGS" .
