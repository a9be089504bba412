#!/usr/bin/env bash
# PyG's own NeighborLoader as the sampled-training baseline: the device image has torch-geometric
# but neither pyg-lib nor torch-sparse (PyG's sampler needs one; neither has a wheel on PyPI), so
# torch-scatter and torch-sparse are built here from their PyPI sdists (carried in .sdist/, CPU
# ops only: NeighborLoader samples on the host; extensions compiled in parallel, in place), then bench/sampled.py runs mgg vs PyG at P = 1.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/device_env.sh
LOGS=/tmp/mgg-logs; mkdir -p "$LOGS"
t0=$(date +%s)
B=/tmp/pyg-build; rm -rf "$B"; mkdir -p "$B"
for f in .sdist/torch_scatter-*.tar.gz .sdist/torch_sparse-*.tar.gz; do tar xzf "$f" -C "$B"; done
sed -i "s/with_options(no_python_abi_suffix=True)/with_options(no_python_abi_suffix=True, use_ninja=False)/" "$B"/torch_sparse-*/setup.py
# every extension of a package built at once (build_ext -j), both packages side by side, in place;
# torch-sparse's setup.py is switched to use_ninja=False as torch-scatter's already is: with ninja,
# BuildExtension writes one build.ninja per package that parallel extension builds overwrite
for d in "$B"/torch_scatter-* "$B"/torch_sparse-*; do
  (cd "$d" && FORCE_ONLY_CPU=1 timeout 420 python3 setup.py -q build_ext -j 16 --inplace > "$LOGS/build-$(basename "$d").log" 2>&1) &
done
wait
echo "build in $(( $(date +%s) - t0 )) s"
export PYTHONPATH="$(echo "$B"/torch_scatter-*):$(echo "$B"/torch_sparse-*):$PYTHONPATH"
python3 -c "import torch_geometric.typing as t; print('WITH_TORCH_SPARSE', t.WITH_TORCH_SPARSE)"
timeout 300 python3 bench/sampled.py --graph products-like --scale 0.1 --epochs 3 --runs store,host --pyg-workers 0,4,12 \
  --out "$LOGS" > "$LOGS/pyg-P1.log" 2>&1
grep -E "^(mgg|pyg|id map|row gather)|nodes|Error" "$LOGS/pyg-P1.log"
grep -h -iE "error" "$LOGS"/build-*.log | head -5
tar czf "$OUT/logs.tgz" -C "$LOGS" .
