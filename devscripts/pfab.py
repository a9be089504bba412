"""One GPU, products-like: the scan kernel with a bulk L2 prefetch of its run's indices, row ends
and row factors at the run's start (MGG_SCAN_L2_PREFETCH) against 0793ef1's kernel; sum, sum with
rf = 1, gcn on a producer-scaled table; D = 16 and 8 at S = 3. CUDA events, median of 3 x 20, two
interleaved reps (best kept); outputs (poisoned) against base. argv: OUT.json pf=cubin"""
import sys, statistics, json
sys.path.insert(0, '.')
import torch, cupy as cp
from bench.fullgraph import load_graph
from bench.local_csr import event_ms
from mgg.runtime import DistGraph, RuntimeConfig, world
from mgg.kernels.local_csr import CsrRowsExecutor

comm = world()
res = {}
g = load_graph("products-like", 1.0, '/tmp/mgg-graphs', comm, 'none')
med = lambda f: statistics.median(event_ms(f, 20) for _ in range(3))
with DistGraph(g.indptr, g.indices, comm, RuntimeConfig(backend="cpu")) as dg:
    exs = {k: CsrRowsExecutor(dg.plan(k), None, k, source_segments=3) for k in ("sum", "gcn")}
    exs["sum1"] = CsrRowsExecutor(dg.plan("sum"), None, "sum", source_segments=3)
    exs["sum1"].rf = torch.ones(g.num_nodes, device='cuda')
    mods = {"base": exs["sum"].module, "pf": cp.RawModule(path=sys.argv[2].split("=", 1)[1])}
    LC = type(exs["sum"].launch_cache)
    for dim in (16, 8):
        x = torch.randn(g.num_nodes, dim, device='cuda')
        xs = (x * exs["gcn"].cf[:, None]).contiguous()
        cases = [("sum", "sum", lambda e: e(x)), ("sum rf=1", "sum1", lambda e: e(x)),
                 ("gcn producer", "gcn", lambda e: e(xs, scaled_input=True))]
        for rep in (1, 2):
            for name, k, f in cases:
                e = exs[k]
                ref = None
                for mn in ("base", "pf"):
                    e.module, e.launch_cache = mods[mn], LC(device=e.device)
                    e.poison = True
                    out = f(e).clone()
                    e.poison = False
                    if ref is None:
                        ref = out
                    err = float((out - ref).norm() / ref.norm())
                    ms = med(lambda: f(e))
                    key = f"{name} D={dim} {mn}"
                    res[key] = min(ms, res.get(key, 1e9))
                    print(f"{key:28s} {ms:7.3f} {'' if err < 1e-6 else f'WRONG {err:.2e}'}", flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
print("\n| products-like, S = 3 (best of 2) | base | L2 prefetch | speedup |")
for dim in (16, 8):
    for name, _, _ in cases:
        b, p = res[f"{name} D={dim} base"], res[f"{name} D={dim} pf"]
        print(f"| D={dim} {name} | {b:.3f} | {p:.3f} | {b / p:.2f}x |")
