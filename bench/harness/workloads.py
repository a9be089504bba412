"""The benchmarks' workloads: datasets, the models of --models, and the training step they time.

A dataset is "name[:scale[:order]]" (parse_dataset), generated once by rank 0, relabelled by
`order` (mgg.data.reorder) and cached as .npz (load_graph). A model is a registry name with
options (model_spec): "gin" is mgg's default GIN (batch norm in its MLP), "gin:none" GIN without a
norm, "+unfused" / "+cublas" suffixes change mgg's model only. `epoch_fn` is the step every
system runs (forward, backward, gradient all-reduce, Adam step; dropout off), and
`epoch_traffic` counts what one such step moves between GPUs.
"""
from __future__ import annotations

import inspect
import os
import time

import numpy as np

from mgg.kernels.variants import benched_variant_names
from mgg.runtime.layout import padded_dim

VARIANTS = benched_variant_names()  # the registry (mgg/kernels/variants.py) says which are timed


def variants_for(dg, wanted: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The benched variants (or those of `wanted`, from --variants) that can run this partition:
    local-only kernels (csr_rows) need every rank free of remote work (the same answer on all ranks)."""
    from mgg.kernels.variants import get_variant

    remote = dg.comm.allreduce_scalar(float(sum(dg.plan(k).num_remote_edges for k in ("gcn", "sum"))), "max")
    return tuple(v for v in (wanted or VARIANTS) if not (get_variant(v).local_only and remote > 0))


def model_spec(spec: str) -> dict:
    """hidden, layers and aggregation kind of model `spec`, from the model registry
    (mgg.nn.registry), with its registry `name` and constructor `options`: "gin" is mgg's default
    GIN (batch norm in the MLP), "gin:none" / "gin:layer" pick GIN's `norm`; a "+unfused" suffix
    (mgg's model only, e.g. "gin+unfused") runs batch norm and the ReLU after it as two steps
    instead of mgg.kernels.norm_relu's fused kernels (`unfused` in the result), and a "+cublas"
    suffix runs mgg's model with its float32 GEMMs on cuBLAS (MGG_TALL_GEMM=0, not
    mgg/kernels/tall_gemm.cu; `cublas`); `mgg_only` is either suffix (the baselines are timed on
    the plain row only). SystemExit for a model whose aggregation does not run through the plan
    (nothing to compare) or a bad norm."""
    from mgg.nn.norm import NORMS
    from mgg.nn.registry import model_entry, tunable_models

    unfused = spec.endswith("+unfused")
    cublas = spec.endswith("+cublas")
    name, _, norm = spec.removesuffix("+unfused").removesuffix("+cublas").partition(":")
    if norm and (name != "gin" or norm not in NORMS):
        raise SystemExit(f"bench/fullgraph.py: --models {spec}: only gin takes a norm ({', '.join(NORMS)})")
    try:
        e = model_entry(name)
    except ValueError as err:
        raise SystemExit(f"bench/fullgraph.py: --models: {err}") from None
    if e.aggregation is None:
        raise SystemExit(f"bench/fullgraph.py: --models {name}: its aggregation does not run through the plan; "
                         f"choose from {', '.join(tunable_models())}")
    options = {}
    if name == "gin":  # the norm every system of the row runs: the model's own default unless given
        options["norm"] = norm or inspect.signature(e.model).parameters["norm"].default
    return dict(name=name, options=options, hidden=e.defaults.hidden, layers=e.defaults.layers,
                kind=e.aggregation, unfused=unfused, cublas=cublas, mgg_only=unfused or cublas)


def build_bench_model(mname: str, g, device, input_cache: bool = True):
    """mgg's model for --models entry `mname` on graph g (dropout off, as every system here).
    `input_cache`: the first layer starts from its input's aggregation computed once
    (mgg.nn.input_cache; the model's default), else it aggregates every step."""
    from mgg.nn import build_model

    m = model_spec(mname)
    model = build_model(m["name"], g.x.shape[1], m["hidden"], int(g.y.max()) + 1, m["layers"], 0.0,
                        **m["options"]).to(device)
    model.cache_input_aggregation = bool(input_cache)
    for mod in model.modules():
        if hasattr(mod, "fuse_relu"):
            mod.fuse_relu = not m["unfused"]
    return model



def variant_list(text: str) -> tuple[str, ...]:
    """--variants: registered names only (argparse error otherwise)."""
    import argparse

    from mgg.kernels.variants import variant_names

    names = tuple(v for v in text.split(",") if v)
    bad = [v for v in names if v not in variant_names()]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {bad}; choose from {', '.join(variant_names())}")
    return names



def parse_dataset(spec: str) -> tuple[str, float, str]:
    """"name[:scale[:order]]" -> (name, scale, node order): e.g. "products-like:1:cluster" is
    products-like at scale 1 relabelled by mgg.data.reorder's "cluster" before partitioning."""
    name, _, rest = spec.partition(":")
    sc, _, order = rest.partition(":")
    return name, float(sc or 1), order or "none"


def load_graph(name: str, scale: float, cache: str, comm, order: str = "none"):
    """Generate once (rank 0; relabelled by `order` unless "none", on the GPU when there is one),
    cache as .npz, load on every rank. The graph's name carries a non-default order
    ("products-like+cluster"), so result rows tell the orders apart."""
    from mgg.data import load_dataset, load_npz, save_npz

    tag = "" if order == "none" else f"-{order}"
    label = name if order == "none" else f"{name}+{order}"
    path = os.path.join(cache, f"{name}-{scale:g}{tag}.npz")
    if comm.rank == 0 and not os.path.exists(path):
        t = time.perf_counter()
        g = load_dataset(name, scale=scale, seed=0)
        print(f"  generated {name} scale {scale:g}: {g.num_nodes} nodes {g.num_edges} edges "
              f"in {time.perf_counter() - t:.1f} s", flush=True)
        if order != "none":
            import torch

            from mgg.data.reorder import reorder_nodes

            t = time.perf_counter()
            g, _ = reorder_nodes(g, order, device="cuda" if torch.cuda.is_available() else "cpu")
            print(f"  relabelled ({order}) in {time.perf_counter() - t:.1f} s", flush=True)
        os.makedirs(cache, exist_ok=True)
        save_npz(g, path)
    comm.barrier()
    return load_npz(path, name=label)



def epoch_fn(model, G, x, y, train_mask, n_train, opt, comm):
    from mgg.nn import allreduce_gradients, cross_entropy_sum

    sets = getattr(G, "bench_train_rows", None)  # mgg's per-layer row sets of the loss (as the CLI)
    layers = len(model.convs)
    rows = None if sets is None else tuple(sets[len(sets) - layers:])  # the model's last `layers`
    train_idx = train_mask.nonzero().squeeze(1)  # an index, not a mask: no host sync in the step
    y_train = y.index_select(0, train_idx)

    def step():
        opt.zero_grad(set_to_none=False)
        if rows is not None:
            loss = cross_entropy_sum(model(x, G, None, rows=rows), y[rows[-1].index]) / n_train
        else:
            out = model(x, G, None)
            loss = cross_entropy_sum(out.index_select(0, train_idx), y_train) / n_train
        loss.backward()
        if comm.size > 1:
            allreduce_gradients(model, comm, getattr(G, "store", None))
        opt.step()
    return step


def epoch_traffic(dg, mname: str, g, comm, device, input_cache: bool = True) -> dict:
    """What one training epoch of `mname` moves between GPUs, counted on the aggregations it
    really runs: each call (kind, direction, width) of dg.aggregate is recorded during one step
    (after a first, uncounted step that builds the model's input cache, a one-time cost), and
    each of them must bring every distinct remote row of its plan once (the halo; per-edge
    variants move more). Returns {"calls": [[kind, transposed, width], ...], "nvlink_bytes"}
    (this rank's; the caller takes the max over ranks)."""
    import torch

    calls = []
    real = dg.aggregate

    def counting(x, kind, transposed=False, **kw):
        calls.append([kind, bool(transposed), int(x.shape[1])])
        return real(x, kind, transposed, **kw)
    x = torch.from_numpy(np.ascontiguousarray(dg.local(g.x))).to(device)
    y = torch.from_numpy(np.ascontiguousarray(dg.local(g.y))).to(device)
    tm = torch.from_numpy(np.ascontiguousarray(dg.local(g.train_mask))).to(device)
    torch.manual_seed(0)
    model = build_bench_model(mname, g, device, input_cache)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = epoch_fn(model, dg, x, y, tm, float(g.train_mask.sum()), opt, comm)
    if input_cache:
        step()
    dg.aggregate = counting
    try:
        step()
    finally:
        del dg.aggregate  # the bound method again
    nbytes = sum(dg.plan(k, t).halo_size * padded_dim(w) * 4 for k, t, w in calls)
    return {"calls": calls, "nvlink_bytes": nbytes}

