# Sourced by the bench/device_*.sh scripts: environment, carried wheels, OUT, NGPU and the mpirun
# command line shared by every device call.
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export MGG_KERNEL_CACHE=/tmp/mgg-kernels PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD"
OUT="${OUT:-/tmp/mgg-out}"; mkdir -p "$OUT"
NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
MPI=(mpirun --allow-run-as-root --bind-to none -x PYTHONPATH -x NVSHMEM_DISABLE_NVLS -x NCCL_NVLS_ENABLE
     -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x MGG_KERNEL_CACHE -x PYTHONUNBUFFERED -x OMP_NUM_THREADS)
LOGS="${LOGS:-/tmp/mgg-logs}"; mkdir -p "$LOGS"   # scripts tar this into $OUT/logs.tgz (<= 8 files come back)

# sample_tests NAME all|one [pytest args...]: tests/gpu/test_sample_gpu.py at P = 1 (log
# $LOGS/NAME-P1.log) and, with "all", at P = all GPUs too (per-rank logs under $LOGS/NAME-P<N>/);
# prints the failures and the pass/fail lines.
sample_tests() {
  local name=$1 which=$2; shift 2
  timeout 120 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/gpu/test_sample_gpu.py "$@" \
    > "$LOGS/$name-P1.log" 2>&1
  grep -E "^(FAILED|E  )|passed|failed" "$LOGS/$name-P1.log" | tail -12
  if [[ $which == all && $NGPU -gt 1 ]]; then
    timeout 150 "${MPI[@]}" -np "$NGPU" --output-filename "$LOGS/$name-P$NGPU" python3 -m pytest -q \
      -p no:cacheprovider -rf --tb=short tests/gpu/test_sample_gpu.py "$@" > /dev/null 2>&1
    grep -rhE "^(FAILED|E  )|passed|failed" "$LOGS/$name-P$NGPU"* | head -20  # a folder (Open MPI 4) or files (5)
  fi
}

# sampled_bench NAME SECONDS [bench/sampled.py args...]: products-like at scale 0.1 without PyG, at
# P = 1 and at P = all GPUs, each run time-boxed; logs $LOGS/NAME-P<P>.log; prints the result lines.
sampled_bench() {
  local name=$1 limit=$2 P; shift 2
  for P in $(printf '%s\n' 1 "$NGPU" | sort -un); do
    local launch=(python3)
    [[ $P -gt 1 ]] && launch=("${MPI[@]}" -np "$P" python3)
    timeout "$limit" "${launch[@]}" bench/sampled.py --graph products-like --scale 0.1 --no-pyg --out "$LOGS" "$@" \
      > "$LOGS/$name-P$P.log" 2>&1
    grep -E "^(mgg|prefetch|row gather)|nodes" "$LOGS/$name-P$P.log"
  done
}
