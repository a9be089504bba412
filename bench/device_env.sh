# Sourced by bench/run.sh: the environment shared by every device run, the carried wheels, NGPU and
# the mpirun command line. With MGG_BENCH_DRY=1 nothing is installed or probed (NGPU defaults to 2).
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export MGG_KERNEL_CACHE="${MGG_KERNEL_CACHE:-/tmp/mgg-kernels}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
export CI=1   # no progress bars
if [[ "${MGG_BENCH_DRY:-0}" == 1 ]]; then
  NGPU="${NGPU:-2}"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  # wheels carried to a bare device machine (a machine without a GPU runs nothing they serve)
  if compgen -G ".whl/*.whl" > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || return 1
    export PYTHONPATH="/tmp/site:$PWD"
  else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  fi
  NGPU="${NGPU:-$(python3 -c "import torch; print(torch.cuda.device_count())")}"
fi
MPI=(mpirun --allow-run-as-root --bind-to none -x PYTHONPATH -x NVSHMEM_DISABLE_NVLS -x NCCL_NVLS_ENABLE
     -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x MGG_KERNEL_CACHE -x PYTHONUNBUFFERED -x OMP_NUM_THREADS -x CI)
