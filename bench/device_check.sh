#!/usr/bin/env bash
# One device call: install the carried wheels, run the GPU tests (P = 1 and P = all GPUs) and the
# full-graph benchmark (P = 1 and P = all GPUs); logs under $OUT, a short table last.
#   bench/device_check.sh [tests|bench|all] [extra bench/fullgraph.py args...]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
what="${1:-all}"; shift || true
source bench/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
rc=0
if [[ "$what" == tests || "$what" == all ]]; then
  t=$(date +%s)
  python3 -c "from mgg.kernels.build import build_cubin; b = build_cubin('aggregate'); print('kernel build:', b)" 2>&1 | tee "$OUT/build.log"
  python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/gpu-tests-P1.log" | tail -3
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  if [[ $NGPU -gt 1 ]]; then
    "${MPI[@]}" -np "$NGPU" python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/gpu-tests-P$NGPU.log" | tail -6
    [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  fi
  echo "tests took $(( $(date +%s) - t )) s (rc=$rc)"
fi
if [[ "$what" == bench || "$what" == all ]]; then
  for P in ${BENCH_P:-1 $NGPU}; do   # BENCH_P="1" or "2" splits the benchmark over calls
    "${MPI[@]}" -np "$P" python3 bench/fullgraph.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench-P$P.log" | grep -v "^ *agg " | tail -4
  done
  python3 bench/fullgraph.py --summarize "$OUT"/fullgraph-*.json 2>&1 | tee "$OUT/table.txt"
fi
exit $rc
