"""One GPU, products-like: mgg_csr_scan with the row factor packed into the row ends
(CsrRowsExecutor.pack_row_factor, this branch) against rf loaded at the write (the same binary,
the flag off). mean, gcn on a producer-scaled table and with its pre-scale pass, sum beside them;
D = 16, 8, 64 at the automatic segment count. CUDA events, median of 3 x 20, two interleaved reps
(best kept); outputs (poisoned) against the flag off. argv: OUT.json"""
import sys, statistics, json
sys.path.insert(0, '.')
import torch
from bench.fullgraph import load_graph, gather_floor
from bench.local_csr import event_ms, hbm_bandwidth
from mgg.runtime import DistGraph, RuntimeConfig, world
from mgg.kernels.local_csr import CsrRowsExecutor

comm = world()
hbm = hbm_bandwidth()
res = {}
g = load_graph("products-like", 1.0, '/tmp/mgg-graphs', comm, 'none')
med = lambda f: statistics.median(event_ms(f, 20) for _ in range(3))
with DistGraph(g.indptr, g.indices, comm, RuntimeConfig(backend="cpu")) as dg:
    exs = {k: CsrRowsExecutor(dg.plan(k), None, k) for k in ("sum", "mean", "gcn")}
    for dim in (16, 8, 64):
        x = torch.randn(g.num_nodes, dim, device='cuda')
        xs = (x * exs["gcn"].cf[:, None]).contiguous()
        for k in exs:
            res[f"{k} D={dim} floor"] = gather_floor(dg.plan(k), k, dim, comm, hbm_GBps=hbm)["ms"]
        cases = [("sum", "sum", lambda e: e(x)), ("mean", "mean", lambda e: e(x)),
                 ("gcn producer", "gcn", lambda e: e(xs, scaled_input=True)), ("gcn prescale", "gcn", lambda e: e(x))]
        for rep in (1, 2):
            for name, k, f in cases:
                e, ref = exs[k], None
                for pack in (False, True):
                    e.pack_row_factor = pack
                    e.poison = True
                    out = f(e).clone()
                    e.poison = False
                    ref = out if ref is None else ref
                    err = float((out - ref).norm() / ref.norm())
                    ms = med(lambda: f(e))
                    key = f"{name} D={dim} {'packed' if pack else 'load'}"
                    res[key] = min(ms, res.get(key, 1e9))
                    fl = res[f"{k} D={dim} floor"]
                    print(f"{key:28s} {ms:7.3f} {fl / ms:5.1%} {'' if err < 1e-6 else f'WRONG {err:.2e}'}", flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
print("\n| products-like, auto segments (best of 2) | rf loaded | rf packed | speedup | floor | share |")
for dim in (16, 8, 64):
    for name, k, _ in cases:
        a, b = res[f"{name} D={dim} load"], res[f"{name} D={dim} packed"]
        fl = res[f"{k} D={dim} floor"]
        print(f"| D={dim} {name} | {a:.3f} | {b:.3f} | {a / b:.2f}x | {fl:.3f} | {fl / b:.0%} |")
