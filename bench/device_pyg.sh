#!/usr/bin/env bash
# PyG's own NeighborLoader as the sampled-training baseline: the device image has torch-geometric
# but neither pyg-lib nor torch-sparse (PyG's sampler needs one; neither has a wheel on PyPI), so
# torch-scatter and torch-sparse are built here from their PyPI sdists (carried in .sdist/, CPU
# ops only: NeighborLoader samples on the host), then bench/sampled.py runs mgg vs PyG at P = 1.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/device_env.sh
LOGS=/tmp/mgg-logs; mkdir -p "$LOGS"
t0=$(date +%s)
FORCE_ONLY_CPU=1 MAX_JOBS=16 timeout 300 python3 -m pip install -q --no-build-isolation --no-deps --no-cache-dir \
  --target /tmp/site .sdist/torch_scatter-*.tar.gz .sdist/torch_sparse-*.tar.gz > "$LOGS/build.log" 2>&1
echo "build rc=$? in $(( $(date +%s) - t0 )) s"; tail -3 "$LOGS/build.log"
python3 -c "import torch_geometric.typing as t; print('WITH_TORCH_SPARSE', t.WITH_TORCH_SPARSE)"
timeout 200 python3 bench/sampled.py --graph products-like --scale 0.1 --epochs 3 --runs store,host --pyg-workers 4 \
  --out "$LOGS" > "$LOGS/pyg-P1.log" 2>&1
grep -E "^(mgg|pyg|id map|row gather)|nodes|Error" "$LOGS/pyg-P1.log"
tar czf "$OUT/logs.tgz" -C "$LOGS" .
