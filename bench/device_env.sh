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
