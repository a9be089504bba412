#!/usr/bin/env bash
# The whole test suite: the multi-rank tests (those marked `mpi`, anywhere under tests/) under
# `mpirun -np 2` and `-np 3`, the simulated-multi-node tests (tests/apps/test_multinode_mpi.py)
# under `-np 4`, then the single-process suite (where the multi-rank tests skip).
#
# Every test has its own time limit (pytest-timeout, MGG_TEST_TIMEOUT seconds, default 600: a hang
# detector far above any test's time on a loaded 2-core box): a test that exceeds it fails, and the
# run goes on. Each failing test is logged the moment it fails (MGG_TEST_FAILURE_LOG,
# tests/conftest.py), so the summary at the end names every failure, also of a run that had to be
# killed (each run still has an outer limit, a backstop for a hang inside C code).
#
# Exits non-zero when any run fails. A multi-rank run that collects nothing (pytest exit 5) is not
# a failure; the single-process one is. The last lines are the summary: one line per run, then
# each failed test.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
PY="${PYTHON:-python}"

export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export OMPI_MCA_osc="^ucx"          # Open MPI 5's UCX one-sided component is noisy without UCX
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export CI="${CI:-true}"             # no progress bars in subprocesses
# Python keeps compiled modules (and pytest its assert-rewritten test modules) in __pycache__ unless
# PYTHONDONTWRITEBYTECODE is set; the suite starts 10 pytest processes and hundreds of
# `python -m mgg...` ones, each of which would compile everything again (collecting the suite:
# 6.0 s of CPU uncached, 3.4 s cached, on a 2-core box)
unset PYTHONDONTWRITEBYTECODE

logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

# A test that fails on one rank while the others wait for it in a collective would hang the run:
# MGG_TEST_ABORT_ON_FAILURE (tests/conftest.py) aborts every rank at the first failure instead,
# after printing and logging it.
mpi=(mpirun --oversubscribe --bind-to none --mca osc ^ucx -x PYTHONPATH -x OMPI_MCA_osc -x OMP_NUM_THREADS -x CI
     -x MGG_TEST_ABORT_ON_FAILURE=1 -x MGG_TEST_FAILURE_LOG)
if [[ "$(id -u)" == 0 ]]; then
  mpi+=(--allow-run-as-root)
fi

# per-test limits: under mpirun a hung rank sits in a collective (C code), where only pytest-timeout's
# thread method (stack dump, then exit) reaches it; the single process raises in the test (signal)
per_test=()
mpi_per_test=()
if "$PY" -c "import pytest_timeout" 2>/dev/null; then
  per_test=(--timeout "${MGG_TEST_TIMEOUT:-600}" --timeout-method signal)
  mpi_per_test=(--timeout "${MGG_TEST_TIMEOUT:-600}" --timeout-method thread)
else
  echo "tests/run_all.sh: pytest-timeout is not installed (pip install -e \".[test]\"): no per-test limits" >&2
fi
backstop() {  # backstop SECONDS: the outer limit of one run
  if command -v timeout >/dev/null 2>&1; then echo timeout --kill-after=30 "$1"; fi
}

results=()   # "what: ok" or "what: FAILED (exit N)"
logged=()    # the failure logs to summarise
# "NP:TESTS": every multi-rank test under 2 and 3 ranks; the simulated 2-nodes-x-2-ranks tests under 4.
# `-m mpi` selects the tests marked mpi (pytest-mpi's marker, which every multi-rank test carries).
for run in "2:tests" "3:tests" "4:tests/apps/test_multinode_mpi.py"; do
  np="${run%%:*}" what="${run#*:}"
  echo "=== mpirun -np $np: -m mpi $what ==="
  export MGG_TEST_FAILURE_LOG="$logs/np$np"
  # shellcheck disable=SC2046
  $(backstop 1200) "${mpi[@]}" -np "$np" "$PY" -m pytest -q --color=no -p no:cacheprovider \
    ${mpi_per_test[@]+"${mpi_per_test[@]}"} --with-mpi -m mpi "$what"
  rc=$?
  logged+=("$logs/np$np".rank*)
  if [[ $rc != 0 && $rc != 5 ]]; then
    results+=("mpirun -np $np -m mpi $what: FAILED (exit $rc)")
  else
    results+=("mpirun -np $np -m mpi $what: ok")
  fi
done

echo "=== single process: tests ==="
export MGG_TEST_FAILURE_LOG="$logs/single"
# shellcheck disable=SC2046
$(backstop 2400) "$PY" -m pytest -q -p no:cacheprovider --durations=15 ${per_test[@]+"${per_test[@]}"} tests
single=$?
logged+=("$logs/single")
if [[ $single != 0 ]]; then
  results+=("single process tests: FAILED (exit $single)")
else
  results+=("single process tests: ok")
fi

echo "=== summary ==="
printf '%s\n' "${results[@]}"
failures="$(cat "${logged[@]}" 2>/dev/null | sed -n 's/^=== FAILED \([^ ]*\) (\([a-z]*\),.*/\1 (\2)/p' | sort -u)"
if [[ -n "$failures" ]]; then
  echo "failed tests:"
  sed 's/^/  /' <<<"$failures"
fi
for r in "${results[@]}"; do
  [[ "$r" == *FAILED* ]] && exit 1
done
exit 0
