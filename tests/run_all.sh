#!/usr/bin/env bash
# The whole test suite: tests/mpi under `mpirun -np 2` and `-np 3`, the simulated-multi-node tests
# (tests/mpi/test_multinode_mpi.py) under `-np 4`, then the single-process suite.
#
# Exits non-zero when any run fails. The single-process pytest runs last, so the final line is
# its normal summary ("N passed ..."); when a multi-rank run failed, one more summary-style line
# says so. A multi-rank run that collects nothing (pytest exit 5) is not a failure; the
# single-process one is.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
PY="${PYTHON:-python}"

export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export OMPI_MCA_osc="^ucx"          # Open MPI 5's UCX one-sided component is noisy without UCX
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export CI="${CI:-true}"             # no progress bars in subprocesses

# A test that fails on one rank while the others wait for it in a collective would hang the run
# until `timeout`: MGG_TEST_ABORT_ON_FAILURE (tests/conftest.py) aborts every rank at the first
# failure instead, after printing it.
mpi=(mpirun --oversubscribe --bind-to none --mca osc ^ucx -x PYTHONPATH -x OMPI_MCA_osc -x OMP_NUM_THREADS -x CI
     -x MGG_TEST_ABORT_ON_FAILURE=1)
if [[ "$(id -u)" == 0 ]]; then
  mpi+=(--allow-run-as-root)
fi
limit=()
if command -v timeout >/dev/null 2>&1; then
  limit=(timeout --kill-after=30 900)   # a hang must not stall CI forever
fi

failed=()
# "NP:TESTS": every multi-rank test under 2 and 3 ranks; the simulated 2-nodes-x-2-ranks tests under 4
for run in "2:tests/mpi" "3:tests/mpi" "4:tests/mpi/test_multinode_mpi.py"; do
  np="${run%%:*}" what="${run#*:}"
  echo "=== mpirun -np $np: $what ==="
  ${limit[@]+"${limit[@]}"} "${mpi[@]}" -np "$np" "$PY" -m pytest -q --color=no -p no:cacheprovider \
    --with-mpi "$what"
  rc=$?
  if [[ $rc != 0 && $rc != 5 ]]; then
    failed+=("mpirun -np $np $what (exit $rc)")
  fi
done

echo "=== single process: tests ==="
${limit[@]+"${limit[@]}"} "$PY" -m pytest -q -p no:cacheprovider tests
rc=$?

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "=== ${#failed[@]} failed multi-rank run(s): ${failed[*]} ==="
  exit 1
fi
exit $rc
