#!/usr/bin/env bash
# The one benchmark runner: bench/run.sh [--dry-run] [--tar] SUITE...
#
# Suites (each a list of stages; "all" runs them in this order):
#   gpu-tests  kernel builds (nvcc, NVRTC probe), the GPU tests (-m gpu tests) at P = 1 and P = all GPUs
#   fullgraph  bench/fullgraph.py at P = 1 and all GPUs, then its table
#   sampled    mgg vs PyG, prefetch on/off (F = 1024, 100), Match-Reorder on/off, full-graph vs
#              sampled accuracy through the CLI, PyG's NeighborLoader (when .sdist/ carries its sources)
#   gat        node/edge crossover sweep, GAT vs PyG at P = 1 and our P-scaling
#   tuner      tuner vs exhaustive grid (products-like, reddit-like), tuner vs a saved grid,
#              `mgg.train --tune` on the GPU
#   embedding  GPU lookup at P = all GPUs, the lookup service on the GPU, examples/dlrm.py, the DLRM
#              training step mgg vs the NCCL all-to-all design (bench/dlrm.py) at P = 1, 2, 4, 8 (<= NGPU)
#   e2e        bench/e2e.py on reddit-like (E2E_ARGS) and on papers-like@0.1 (E2E_PAPERS_SCALE), P = 1
#   one-gpu    the P = 1 table: GCN, GIN (batch norm; also with batch norm and ReLU as two
#              steps, gin+unfused) and GIN without a norm on reddit-like, products-like and
#              products-like in the cluster order, with csr_rows, eager and with the step in a CUDA
#              graph, against plain torch with the same model, with and without the first layer's
#              input cache; one step kernel by kernel (bench/step_kernels.py); the aggregation
#              alone at D = 16, 64 with its floors (bench/local_csr.py, wpb 4/8/16, packed rows
#              and bundles); GAT against PyG
#              (products-like@0.5, bench/gat.py)
#   scaling    python -m mgg.train with default flags at P = 1, 2, 4, 8 on reddit-like and products-like in
#              the input order and mgg.prepare's (bench/scaling.py --cli; SCALING_CLI_ARGS); then
#              bench/fullgraph.py at P = 1, 2, 4, 8 (those the machine has; with 3+ GPUs P = 1 runs on
#              the last GPU beside P = 2 on the first two), then bench/scaling.py's table (speedup over P = 1 and over NCCL, GPU memory, NVLink MB and floor per epoch);
#              bench/overlap.py (local, remote, both) at P = all GPUs when there are several
#
# Every run writes <root>/<date>-<gpu>x<count>-<commit>/ with manifest.json (bench/manifest.py),
# summary.txt (per stage: exit code, seconds, its result lines), stages.tsv and the stage logs and
# result files; <root> is $OUT when set (the device tool), else bench/results. --tar packs all but
# manifest.json and summary.txt into logs.tgz (the device tool returns a few files only).
# --dry-run prints the stages and their commands and runs nothing. The environment (NVLS off,
# carried wheels, mpirun line) is bench/device_env.sh. Knobs: NGPU, BENCH_P ("1 2": fullgraph P
# list), FULLGRAPH_ARGS, TUNER_RUNS (3), GAT_SCALE_PRODUCTS (0.25), GAT_SCALE_REDDIT (0.1),
# SAMPLED_DATASET (products-like), SAMPLED_SCALE (0.1), E2E_ARGS, E2E_PAPERS_SCALE (0.1), SCALING_ARGS
# (fullgraph flags of the scaling suite; default csr_rows, halo, halo_csr, with --cuda-graph rows),
# SCALING_P ("1 2 4 8": its P values), SCALING_SEQUENTIAL (1: P = 1 and P = 2 one after the other).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

ORDER=(gpu-tests fullgraph sampled gat tuner embedding e2e one-gpu scaling)
declare -A STAGES=(
  [gpu-tests]="build nvrtc-probe gpu-tests"
  [fullgraph]="fullgraph"
  [sampled]="sampled-vs-pyg sampled-prefetch sampled-reorder sampled-accuracy pyg-neighborloader"
  [gat]="gat-threshold gat"
  [tuner]="tune-grid tune-saved-grid train-tune"
  [embedding]="embedding-lookup embedding-serve dlrm"
  [e2e]="e2e e2e-papers"
  [one-gpu]="one-gpu-epochs one-gpu-kernels one-gpu-gat"
  [scaling]="scaling-cli scaling overlap"
)
SAVED_REDDIT_GRID=bench/results/2026-11-23-h200x2-394dc46/tune-grid-reddit-like-P2-20261123-030756.json

usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; }

ARGV="bench/run.sh $*"
DRY=0 TAR=0 suites=()
while (($#)); do
  case "$1" in
    --dry-run) DRY=1 ;;
    --tar) TAR=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "bench/run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    all) suites+=("${ORDER[@]}") ;;
    *) if [[ -z "${STAGES[$1]+x}" ]]; then
         echo "bench/run.sh: unknown suite '$1'; expected one of: ${ORDER[*]} all" >&2; exit 2
       fi
       suites+=("$1") ;;
  esac
  shift
done
if [[ ${#suites[@]} -eq 0 ]]; then usage >&2; exit 2; fi

stages=()   # the suites' stages in order, each once
for s in "${suites[@]}"; do
  for st in ${STAGES[$s]}; do
    [[ " ${stages[*]} " == *" $st "* ]] || stages+=("$st")
  done
done

export MGG_BENCH_DRY=$DRY
# shellcheck source=bench/device_env.sh
source bench/device_env.sh || { echo "bench/run.sh: bench/device_env.sh failed" >&2; exit 1; }
if ((!DRY && NGPU < 1)); then   # every suite measures or tests GPUs: refuse before building anything
  echo "bench/run.sh: no CUDA GPU visible (torch.cuda.device_count() is 0): the suites run on a GPU machine;" \
       "--dry-run lists their stages here" >&2
  exit 2
fi
((NGPU >= 1)) || NGPU=1
PS=$(printf '%s\n' 1 "$NGPU" | sort -un | tr '\n' ' ')   # P = 1 and P = all GPUs (once when 1 GPU)

if ((DRY)); then
  RUN="<run-dir>"
else
  root="${OUT:-bench/results}"; mkdir -p "$root"
  RUN=$(python3 bench/manifest.py begin "$root" --suites "${suites[*]}" --command "$ARGV") || exit 1
  : > "$RUN/stages.tsv"
  : > "$RUN/summary.txt"
fi

# run_cmd LIMIT P LOG PATTERN CMD...: CMD at P ranks (P > 1: under mpirun), time-boxed, output in
# $RUN/LOG; the lines matching PATTERN go to the summary. Dry run: print the command only.
run_cmd() {
  local limit=$1 p=$2 log=$3 pattern=$4; shift 4
  local cmd=("$@")
  if ((p > 1)); then cmd=("${MPI[@]}" -np "$p" "${cmd[@]}"); fi
  if ((DRY)); then
    echo "    timeout $limit $(printf '%q ' "${cmd[@]}")> $RUN/$log"
    return 0
  fi
  timeout --kill-after=10 "$limit" "${cmd[@]}" > "$RUN/$log" 2>&1
  local rc=$?
  { echo "  [$log rc=$rc]"; grep -E "$pattern" "$RUN/$log" | tail -n 12; } >> "$RUN/summary.txt"
  return $rc
}

skip() {  # skip REASON: a stage that does not apply here
  if ((DRY)); then echo "    (skipped when $1)"; else echo "  skipped: $1" >> "$RUN/summary.txt"; fi
}

TESTS="passed|failed|FAILED|Error"

# -- gpu-tests ------------------------------------------------------------------------------------
stage_build() {
  local rc=0
  run_cmd 180 1 build.log "kernel build|Error" python3 -c \
    "from mgg.kernels.build import build_cubin; print('kernel build:', build_cubin('aggregate'))" || rc=1
  run_cmd 120 1 build-gat.log "build|Error" python3 -c "from mgg.graph.gat_gpu import build; print('gat build:', build())" || rc=1
  return $rc
}
stage_nvrtc-probe() {
  run_cmd 180 1 nvrtc-probe.log "path|nvrtc|Error" env MGG_KERNEL_BUILD=nvrtc MGG_KERNEL_CACHE=/tmp/kc-nvrtc python3 -c \
    "from mgg.kernels.build import build_cubin; b = build_cubin('aggregate'); print(b); print(open(b.path + '.json').read())"
}
stage_gpu-tests() {
  local rc=0 p
  for p in $PS; do
    # each failure's report is written the moment it happens (tests/conftest.py), per rank: a run
    # stopped by its limit before pytest's summary keeps them; at P > 1 the first failure aborts
    # every rank (the others would wait for it in a collective until the limit)
    run_cmd 300 "$p" "gpu-tests-P$p.log" "$TESTS" env MGG_TEST_FAILURE_LOG="$RUN/gpu-tests-P$p.failures" \
      MGG_TEST_ABORT_ON_FAILURE=1 python3 -m pytest -q -p no:cacheprovider -rf -m gpu tests || rc=1
  done
  return $rc
}

# -- fullgraph ------------------------------------------------------------------------------------
stage_fullgraph() {
  local rc=0 p
  for p in ${BENCH_P:-$PS}; do
    # shellcheck disable=SC2086  # FULLGRAPH_ARGS is a list of words
    run_cmd 600 "$p" "fullgraph-P$p.log" "^(reddit|products|papers)|speedup|Error" \
      python3 bench/fullgraph.py --out "$RUN" ${FULLGRAPH_ARGS:-} || rc=1
  done
  run_cmd 60 1 fullgraph-table.txt "." python3 bench/fullgraph.py --summarize "$RUN"/fullgraph-*.json || rc=1
  return $rc
}

# -- sampled --------------------------------------------------------------------------------------
SAMPLED=(bench/sampled.py --graph "${SAMPLED_DATASET:-products-like}" --scale "${SAMPLED_SCALE:-0.1}")
stage_sampled-vs-pyg() {
  local rc=0
  run_cmd 150 1 sampled-P1.log "^(mgg|pyg|id map|row gather)|nodes" python3 "${SAMPLED[@]}" --epochs 2 --out "$RUN" || rc=1
  if ((NGPU > 1)); then
    run_cmd 120 "$NGPU" "sampled-P$NGPU.log" "^(mgg|row gather)|nodes" python3 "${SAMPLED[@]}" --epochs 2 --no-pyg \
      --out "$RUN" || rc=1
  fi
  return $rc
}
stage_sampled-prefetch() {   # the two-stream prefetch on/off, host and store tiers, F = 1024 and native (100)
  local rc=0 f p
  for f in 1024 0; do
    for p in $PS; do
      run_cmd 150 "$p" "prefetch-F$f-P$p.log" "^(mgg|prefetch|row gather)|nodes" python3 "${SAMPLED[@]}" --no-pyg \
        --epochs 3 --rounds 3 --runs host,host+noprefetch,store,store+noprefetch --feat-dim "$f" --out "$RUN" || rc=1
    done
  done
  return $rc
}
stage_sampled-reorder() {
  local rc=0 p
  for p in $PS; do
    run_cmd 200 "$p" "reorder-P$p.log" "^(mgg|prefetch|row gather)|nodes" python3 "${SAMPLED[@]}" --no-pyg \
      --epochs 3 --rounds 2 --runs store,store+reorder,host,host+reorder --out "$RUN" || rc=1
  done
  return $rc
}
stage_sampled-accuracy() {   # Table-3 style: full-graph vs sampled test accuracy through the CLI
  local rc=0 run p mode extra
  for run in "1 full" "1 sampled" "$NGPU sampled"; do
    read -r p mode <<< "$run"
    extra=(--model sage --epochs 100)
    [[ $mode == sampled ]] && extra=(--mode sampled --fanout 25,10 --batch-size 1024 --epochs 8)
    run_cmd 100 "$p" "acc-$mode-P$p.log" "test_acc|median_epoch|sampling:" python3 -m mgg.train \
      --dataset "${SAMPLED_DATASET:-products-like}" --scale "${SAMPLED_SCALE:-0.1}" --backend gpu --no-progress \
      --eval-every 1000 "${extra[@]}" --metrics-json "$RUN/acc-$mode-P$p.json" || rc=1
  done
  return $rc
}
stage_pyg-neighborloader() {   # PyG's own NeighborLoader: torch-scatter/-sparse built from .sdist/ (CPU ops)
  if ! compgen -G ".sdist/torch_sparse-*.tar.gz" > /dev/null && ((!DRY)); then
    skip "no .sdist/torch_sparse-*.tar.gz (PyG's sampler needs torch-sparse or pyg-lib)"; return 0
  fi
  local b=/tmp/pyg-build
  run_cmd 480 1 pyg-build.log "build in|Error" bash -c '
    set -u; b=$1; t0=$(date +%s); rm -rf "$b"; mkdir -p "$b"
    for f in .sdist/torch_scatter-*.tar.gz .sdist/torch_sparse-*.tar.gz; do tar xzf "$f" -C "$b"; done
    # with ninja, parallel extension builds of one package overwrite its one build.ninja
    sed -i "s/with_options(no_python_abi_suffix=True)/with_options(no_python_abi_suffix=True, use_ninja=False)/" "$b"/torch_sparse-*/setup.py
    for d in "$b"/torch_scatter-* "$b"/torch_sparse-*; do
      (cd "$d" && FORCE_ONLY_CPU=1 python3 setup.py -q build_ext -j 16 --inplace > "$2/build-$(basename "$d").log" 2>&1) &
    done
    wait; echo "build in $(( $(date +%s) - t0 )) s"' _ "$b" "$RUN" || return 1
  local pp; pp="$(echo "$b"/torch_scatter-*):$(echo "$b"/torch_sparse-*):$PYTHONPATH"
  run_cmd 300 1 pyg-P1.log "^(mgg|pyg|id map|row gather)|nodes|Error|WITH_TORCH_SPARSE" env PYTHONPATH="$pp" python3 \
    "${SAMPLED[@]}" --epochs 3 --runs store,host --pyg-workers 0,4,12 --out "$RUN"
}

# -- gat ------------------------------------------------------------------------------------------
GAT_SCALES=(--scale-products "${GAT_SCALE_PRODUCTS:-0.25}" --scale-reddit "${GAT_SCALE_REDDIT:-0.1}")
stage_gat-threshold() {
  run_cmd 120 1 gat-threshold.log "." python3 bench/gat_threshold.py --out "$RUN"
}
stage_gat() {
  local rc=0
  run_cmd 150 1 gat-P1.log "mgg|pyg|generated" python3 bench/gat.py "${GAT_SCALES[@]}" --epochs 5 --out "$RUN" || rc=1
  if ((NGPU > 1)); then
    run_cmd 120 "$NGPU" "gat-P$NGPU.log" "mgg|generated" python3 bench/gat.py --no-pyg "${GAT_SCALES[@]}" --epochs 5 \
      --out "$RUN" || rc=1
  fi
  run_cmd 60 1 gat-table.txt "." python3 bench/gat.py --summarize "$RUN"/gat-*.json || rc=1
  return $rc
}

# -- tuner ----------------------------------------------------------------------------------------
stage_tune-grid() {   # tuner vs the exhaustive grid, TUNER_RUNS independent searches per graph
  local rc=0 g
  for g in products-like reddit-like; do
    run_cmd 300 "$NGPU" "tune-grid-$g.log" "^(grid:|tuner|log)" python3 bench/tune_grid.py --graph "$g" --scale 1 \
      --dim 16 --variants pipelined --tuner-runs "${TUNER_RUNS:-3}" --out "$RUN" || rc=1
  done
  return $rc
}
stage_tune-saved-grid() {   # the tuner alone, scored against a saved grid of the same graph
  run_cmd 150 "$NGPU" tune-saved-grid-reddit.log "^(tuner|log)" python3 bench/tune_grid.py --graph reddit-like \
    --scale 1 --dim 16 --no-grid --grid-from "$SAVED_REDDIT_GRID" --variants pipelined --tuner-runs 3 --out "$RUN"
}
stage_train-tune() {
  run_cmd 90 "$NGPU" train-tune.log "tuner|test_acc|median_epoch" python3 -m mgg.train --dataset products-like \
    --scale 0.2 --backend gpu --tune --tune-cache "$RUN/tuning.json" --tune-log "$RUN/train-tune-log.json" \
    --epochs 40 --no-progress --metrics-json "$RUN/train-tune-metrics.json"
}

# -- embedding ------------------------------------------------------------------------------------
stage_embedding-lookup() {
  run_cmd 240 "$NGPU" embedding-gpu.log "batch|GPU|speedup|Error" python3 bench/embedding.py --backend gpu \
    --label GPU --out "$RUN"
}
stage_embedding-serve() {   # launches its own `mpirun -np NGPU python -m mgg.serve`
  run_cmd 90 1 serve-gpu.log "req|p50|Error" python3 bench/embedding.py --mode serve --backend gpu --np "$NGPU" \
    --out "$RUN"
}
stage_dlrm() {   # the example at P = all GPUs, then the training-step bench at P = 1, 2, 4, 8 (those present)
  local rc=0 p
  run_cmd 60 "$NGPU" dlrm-gpu.log "step|auc|loss|Error" python3 examples/dlrm.py --backend gpu --steps 50 || rc=1
  for p in 1 2 4 8; do
    ((p <= NGPU)) || continue
    run_cmd 300 "$p" "dlrm-step-p$p.log" "^(mgg|a2a|torchrec|a2a/mgg) |Error|do not train" python3 bench/dlrm.py \
      --backend gpu --max-rows 0 --json "$RUN/dlrm-step-gpu-p$p.json" || rc=1
  done
  return $rc
}

# -- e2e ------------------------------------------------------------------------------------------
stage_e2e() {   # one process launches the CLI runs itself (P = 1 unless E2E_ARGS has --np)
  if [[ ! -f bench/e2e.py ]]; then skip "bench/e2e.py is absent"; return 0; fi
  local out=()
  if ((DRY)) || python3 bench/e2e.py --help 2>/dev/null | grep -q -- "--out"; then out=(--out "$RUN"); fi
  # shellcheck disable=SC2086  # E2E_ARGS is a list of words
  run_cmd 600 1 e2e.log "." python3 bench/e2e.py "${out[@]}" ${E2E_ARGS:-}
}
stage_e2e-papers() {   # papers-like (E2E_PAPERS_SCALE, 0.1) drawn on the GPU; mgg, --dropout 0 (each replayed
                       # and with --no-cuda-graph), plain torch
  run_cmd 600 1 e2e-papers.log "." python3 bench/e2e.py --out "$RUN/e2e-papers" --graph papers-like \
    --scale "${E2E_PAPERS_SCALE:-0.1}" --prepare-device cuda --runs mgg,mgg-eager,mgg-nodrop,mgg-eager-nodrop,torch
}

# -- one-gpu --------------------------------------------------------------------------------------
stage_one-gpu-epochs() {   # one dataset per run: each fits the 600 s limit with its baselines
  local rc=0 d
  for d in reddit-like:1 products-like:1 products-like:1:cluster; do
    run_cmd 600 1 "one-gpu-${d//:/-}.log" "best mgg|agg |Error" python3 bench/fullgraph.py --out "$RUN/one-gpu" \
      --datasets "$d" --models gcn,gin,gin+unfused,gin:none --variants csr_rows --cuda-graph --input-cache both \
      --no-pyg --epochs 10 || rc=1
  done
  return $rc
}
stage_one-gpu-kernels() {
  local rc=0
  run_cmd 300 1 step-kernels.log "^==|^ +[0-9]" python3 bench/step_kernels.py --dataset products-like:1 \
    --models gcn,gin:none,gin --top 12 || rc=1
  run_cmd 400 1 local-csr.log "D=|csr_rows|floor|Error" python3 bench/local_csr.py \
    --datasets reddit-like:1,products-like:1 --dims 16,64 --kinds gcn,sum_self --wpb 4,8,16 --reps 20 || rc=1
  return $rc
}

stage_one-gpu-gat() {  # GAT 2 layers against PyG GATConv where PyG fits
  run_cmd 200 1 one-gpu-gat.log "mgg|pyg|generated|Error" python3 bench/gat.py --graphs products-like \
    --scale-products 0.5 --epochs 5 --out "$RUN/one-gpu"
}

# -- scaling --------------------------------------------------------------------------------------
# the variants that win (csr_rows at P = 1, halo / halo_csr with remote work; the per-edge ones
# ran past the 600 s limit in earlier runs), eagerly and with the step in a CUDA graph
SCALING_DEFAULT="--datasets reddit-like:1,products-like:1 --variants csr_rows,halo,halo_csr --cuda-graph --no-pyg --epochs 10"
stage_scaling() {
  local rc=0 p ps=() beside="" pid
  for p in ${SCALING_P:-1 2 4 8}; do ((p <= NGPU)) && ps+=("$p"); done  # SCALING_P: e.g. one P per call
  local fg=(python3 bench/fullgraph.py --out "$RUN/scaling")
  # shellcheck disable=SC2206  # SCALING_ARGS is a list of words
  fg+=(${SCALING_ARGS:-$SCALING_DEFAULT})
  local pat="^(reddit|products|papers)|Error"
  # With a third GPU, P = 1 runs on the last GPU beside P = 2 on the first two (SCALING_SEQUENTIAL=1:
  # one after the other). Disjoint GPUs give the same numbers: on 4x H200 the P = 1 epochs beside
  # P = 2 were 3.03/29.42/3.43/64.95 ms against 2.99-3.03/29.46/3.45/64.53-64.89 alone or beside
  # another run (bench/results/2026-11-26-h200x4-f14d292 c1, c3; 2026-11-26-h200x1-064c5d3 c10).
  if ((NGPU >= 3)) && [[ -z "${SCALING_SEQUENTIAL:-}" && " ${ps[*]} " == *" 1 "* && " ${ps[*]} " == *" 2 "* ]]; then
    beside=1
    if ((DRY)); then
      echo "    (P = 1 on GPU $((NGPU - 1)), beside P = 2 on GPUs 0,1)"
      run_cmd 600 1 scaling-P1.log "$pat" env CUDA_VISIBLE_DEVICES=$((NGPU - 1)) "${fg[@]}"
    else
      run_cmd 600 1 scaling-P1.log "$pat" env CUDA_VISIBLE_DEVICES=$((NGPU - 1)) "${fg[@]}" &
      pid=$!
    fi
    run_cmd 600 2 scaling-P2.log "$pat" env CUDA_VISIBLE_DEVICES=0,1 "${fg[@]}" || rc=1
    if [[ -n "${pid:-}" ]]; then wait "$pid" || rc=1; fi
  fi
  for p in "${ps[@]}"; do
    if [[ -n "$beside" ]] && ((p <= 2)); then continue; fi
    run_cmd 600 "$p" "scaling-P$p.log" "$pat" "${fg[@]}" || rc=1
  done
  run_cmd 60 1 scaling-table.txt "." python3 bench/scaling.py --summarize "$RUN/scaling" || rc=1
  return $rc
}
# what users run: python -m mgg.train with default flags at P = 1, 2, 4, 8 (those the machine has)
# on each graph in its input order and in the order mgg.prepare writes (bench/scaling_cli.py)
SCALING_CLI_DEFAULT="--ranks 1,2,4,8 --datasets reddit-like:1,products-like:1 --orders none,auto --models gcn,gin --epochs 30"
stage_scaling-cli() {
  # shellcheck disable=SC2086  # SCALING_CLI_ARGS is a list of words
  run_cmd 1800 1 scaling-cli.log "^ +(reddit|products|papers)|dataset|P=|Error" python3 bench/scaling.py --cli \
    --out "$RUN/scaling-cli" ${SCALING_CLI_ARGS:-$SCALING_CLI_DEFAULT}
}
stage_overlap() {
  if ((NGPU < 2)); then skip "one GPU: no remote work to overlap"; return 0; fi
  run_cmd 300 "$NGPU" overlap.log "^ +(reddit|products)|Error" python3 bench/overlap.py --out "$RUN/overlap.json"
}

# -- the run --------------------------------------------------------------------------------------
failed=0
((DRY)) && echo "bench/run.sh --dry-run: suites ${suites[*]}; NGPU=$NGPU; results in $RUN"
for st in "${stages[@]}"; do
  echo "== $st"
  if ((DRY)); then "stage_$st"; continue; fi
  echo "== $st" >> "$RUN/summary.txt"
  t0=$(date +%s)
  "stage_$st"
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  printf '%s\t%s\t%s\n' "$st" "$rc" "$secs" >> "$RUN/stages.tsv"
  echo "   rc=$rc, ${secs} s"
  ((rc == 0)) || failed=$((failed + 1))
done
((DRY)) && exit 0

python3 bench/manifest.py end "$RUN"
echo "== ${#stages[@]} stages, $failed failed" >> "$RUN/summary.txt"
if ((TAR)); then
  (cd "$RUN" && find . -type f ! -name manifest.json ! -name summary.txt ! -name logs.tgz -print0 | tar czf logs.tgz --null -T - \
    --remove-files)
fi
cat "$RUN/summary.txt"
echo "results: $RUN"
((failed == 0))
