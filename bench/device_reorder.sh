#!/usr/bin/env bash
# Match-Reorder with the overlap matrix on the GPU: its GPU test, then sampled training with and
# without reorder (store and host tiers), products-like at 0.1, P = 1 and P = all GPUs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/device_env.sh
sample_tests reorder-tests one -k "overlap or prefetch"
sampled_bench reorder 200 --epochs 3 --rounds 2 --runs store,store+reorder,host,host+reorder
tar czf "$OUT/logs.tgz" -C "$LOGS" .
