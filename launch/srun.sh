#!/usr/bin/env bash
# Launch mgg inside a Slurm allocation (sbatch launch/slurm.sbatch, or salloc), one rank per GPU.
#
#   launch/srun.sh [--launcher srun|mpirun] [--module mgg.train|mgg.doctor] [--dry-run] [--] [flags...]
#
# Examples (inside `salloc -N 2 --ntasks-per-node=4 --gpus-per-node=4`):
#   launch/srun.sh --module mgg.doctor --backend gpu
#   launch/srun.sh -- --dataset papers-like --epochs 500 --checkpoint-dir ckpt --resume auto
#   launch/srun.sh --launcher mpirun -- --dataset reddit-like --epochs 100
#
# Launchers:
#   srun   (default) srun --mpi=pmix --ntasks-per-node=G --gpus-per-task=1 --gpu-bind=none ...
#          Slurm starts every rank through PMIx (Open MPI 5 / MPICH built with PMIx); Slurm's
#          SIGTERM before the time limit reaches every rank directly (docs/multinode.md).
#   mpirun mpirun -np N*G --map-by ppr:G:node inside the allocation (Open MPI reads the Slurm
#          allocation); for sites whose Slurm lacks PMIx support.
# One rank per GPU: G = MGG_GPUS_PER_NODE, else SLURM_GPUS_ON_NODE, SLURM_GPUS_PER_NODE, else the
# GPUs nvidia-smi lists on this node; with no GPU (CPU path), SLURM_NTASKS_PER_NODE or 1.
# --gpu-bind=none keeps every GPU of the node visible to every rank (mgg picks GPU = local rank),
# so NVSHMEM/CUDA IPC can reach the peers over NVLink; Slurm's per-task binding would hide them.
#
# Environment exported to every rank (a value already set wins):
#   NVSHMEM_BOOTSTRAP=MPI          NVSHMEM is bootstrapped through MPI (mgg hands it its communicator)
#   NVSHMEM_DISABLE_NVLS=1         NVLink multicast objects off (they can fail to allocate or hang)
#   NCCL_NVLS_ENABLE=0             the same for NCCL
#   NVSHMEM_SYMMETRIC_SIZE         passed through when set: per-GPU symmetric heap; size it to at
#                                  least 1.5 x rows_per_pe x (F + hidden + classes) x 4 bytes
#                                  (docs/multinode.md); NVSHMEM's default is 1 GiB
#   NVSHMEM_REMOTE_TRANSPORT, NVSHMEM_IB_ENABLE_IBGDA, NVSHMEM_HCA_PE_MAPPING  passed through when set
#                                  (inter-node transport: ibrc (default, InfiniBand/RoCE), ucx,
#                                  libfabric (Slingshot, EFA), none)
#   OMPI_MCA_osc=^ucx, PYTHONPATH (the repository root), OMP_NUM_THREADS (cores per task)
# Extra launcher arguments: MGG_SRUN_ARGS / MGG_MPIRUN_ARGS. Interpreter: PYTHON.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
launcher=srun
module=mgg.train
dry=0
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --launcher) launcher="${2:?missing value for --launcher}"; shift 2 ;;
    --module) module="${2:?missing value for --module}"; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --) shift; args+=("$@"); break ;;
    *) args+=("$1"); shift ;;
  esac
done
case "$launcher" in srun|mpirun) ;; *) echo "launch/srun.sh: --launcher must be srun or mpirun, got '$launcher'" >&2; exit 2 ;; esac
case "$module" in mgg.train|mgg.doctor) ;; *) echo "launch/srun.sh: --module must be mgg.train or mgg.doctor, got '$module'" >&2; exit 2 ;; esac
if [[ -z "${SLURM_JOB_ID:-}" && $dry == 0 ]]; then
  echo "launch/srun.sh: not inside a Slurm allocation (no SLURM_JOB_ID); use sbatch/salloc, or launch/mpirun.sh" >&2
  exit 2
fi

# GPUs per node ("4", "h100:4" or "gpu:h100:4" -> 4)
gpus="${MGG_GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-}}}"
gpus="${gpus##*:}"
if [[ -z "$gpus" ]] && command -v nvidia-smi >/dev/null 2>&1; then
  gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
fi
if [[ -z "$gpus" || "$gpus" == 0 ]]; then
  gpus=0
  per_node="${SLURM_NTASKS_PER_NODE:-1}"
  per_node="${per_node%%(*}"     # "4(x2)" -> 4
else
  per_node="$gpus"
fi
if ! [[ "$per_node" =~ ^[1-9][0-9]*$ ]]; then
  echo "launch/srun.sh: cannot tell the ranks per node (got '$per_node'); set MGG_GPUS_PER_NODE" >&2
  exit 2
fi
nodes="${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}"
ntasks=$(( nodes * per_node ))
cpus="${SLURM_CPUS_PER_TASK:-}"
if [[ -z "$cpus" ]]; then
  cores="$(nproc 2>/dev/null || echo "$per_node")"
  cpus=$(( cores / per_node > 0 ? cores / per_node : 1 ))
fi

export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export NVSHMEM_BOOTSTRAP="${NVSHMEM_BOOTSTRAP:-MPI}"
export NVSHMEM_DISABLE_NVLS="${NVSHMEM_DISABLE_NVLS:-1}"
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
export OMPI_MCA_osc="${OMPI_MCA_osc:-^ucx}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$cpus}"
pass=(PYTHONPATH NVSHMEM_BOOTSTRAP NVSHMEM_DISABLE_NVLS NCCL_NVLS_ENABLE OMPI_MCA_osc OMP_NUM_THREADS)
for v in NVSHMEM_SYMMETRIC_SIZE NVSHMEM_REMOTE_TRANSPORT NVSHMEM_IB_ENABLE_IBGDA NVSHMEM_HCA_PE_MAPPING \
         MGG_RANKS_PER_NODE MGG_FAULT_INJECT; do
  if [[ -n "${!v:-}" ]]; then
    export "${v?}"
    pass+=("$v")
  fi
done

py="${PYTHON:-python}"
if [[ $launcher == srun ]]; then
  cmd=(srun --mpi=pmix --nodes="$nodes" --ntasks="$ntasks" --ntasks-per-node="$per_node"
       --cpus-per-task="$cpus" --kill-on-bad-exit=1 --export=ALL)
  if [[ $gpus != 0 ]]; then
    cmd+=(--gpus-per-task=1 --gpu-bind=none)
  fi
  extra=()
  if [[ -n "${MGG_SRUN_ARGS:-}" ]]; then
    read -r -a extra <<<"$MGG_SRUN_ARGS"
  fi
else
  cmd=(mpirun -np "$ntasks" --map-by "ppr:$per_node:node" --bind-to none)
  for v in "${pass[@]}"; do
    cmd+=(-x "$v")
  done
  if [[ "$(id -u)" == 0 ]]; then
    cmd+=(--allow-run-as-root)
  fi
  extra=()
  if [[ -n "${MGG_MPIRUN_ARGS:-}" ]]; then
    read -r -a extra <<<"$MGG_MPIRUN_ARGS"
  fi
fi
cmd+=(${extra[@]+"${extra[@]}"} "$py" -m "$module" ${args[@]+"${args[@]}"})

echo "launch/srun.sh: $nodes node(s) x $per_node rank(s) ($([[ $gpus != 0 ]] && echo "one per GPU" || echo "CPU path")): ${cmd[*]}" >&2
if [[ $dry == 1 ]]; then
  exit 0
fi
exec "${cmd[@]}"
