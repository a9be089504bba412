"""Where DistGraph.plan's seconds go on one GPU: each build_plan step timed with CUDA syncs.

    python bench/plan_phases.py GRAPH.npz     (one GPU; prints plans, executors, D2H GiB and per-step s)
"""
import sys, time
import torch
import mgg.runtime.plan as planmod
import mgg.graph.dist_graph as graphmod
from mgg.data.npz import load_npz
from mgg.runtime import Communicator
from mgg.graph import DistGraph, RuntimeConfig

path = sys.argv[1]
T = {}
def timed(name, fn):
    def w(*a, **k):
        torch.cuda.synchronize(); t = time.perf_counter()
        r = fn(*a, **k)
        torch.cuda.synchronize(); T[name] = T.get(name, 0.0) + time.perf_counter() - t
        return r
    return w
nbytes = [0]
orig_host = planmod._host
def host(t):
    nbytes[0] += t.numel() * t.element_size()
    return orig_host(t)
planmod._host = timed("d2h (_host)", host)
planmod._split_rows_t = timed("split", planmod._split_rows_t)
planmod._cut_t = timed("cut", planmod._cut_t)
planmod._cut_remote_t = timed("cut_remote", planmod._cut_remote_t)
graphmod.pair_weights_by_row = timed("weights", graphmod.pair_weights_by_row)
graphmod.build_plan = timed("build_plan total", graphmod.build_plan)
t0 = time.perf_counter(); g = load_npz(path, mmap=True); t_load = time.perf_counter() - t0
t0 = time.perf_counter()
dg = DistGraph.build(g, Communicator(), RuntimeConfig(backend="gpu"))
torch.cuda.synchronize(); t_dg = time.perf_counter() - t0
t0 = time.perf_counter(); dg.plan("gcn"); dg.plan("gcn", True); torch.cuda.synchronize(); t_plan = time.perf_counter() - t0
t0 = time.perf_counter(); dg.prepare(); torch.cuda.synchronize(); t_build = time.perf_counter() - t0
print(f"{path}: load {t_load:.2f} s, DistGraph {t_dg:.2f} s {dg.build_seconds}, plans {t_plan:.2f} s, executors {t_build:.2f} s; "
      f"d2h {nbytes[0]/2**30:.2f} GiB")
print("  " + ", ".join(f"{k} {v:.3f}" for k, v in T.items()))
