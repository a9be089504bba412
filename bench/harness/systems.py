"""Epoch timing of the systems the full-graph benchmark compares.

`time_system` times mgg's model over any graph wrapper with DistGraph's interface (mgg's own, or
bench/baselines.py's NcclHaloGraph and SingleGpuGraph), optionally captured in a CUDA graph
(`graph_ms`); `plain_torch_epoch` and `pyg_epoch` time the baselines that bring their own model
(bench/baselines.py's plain torch model and PygModel). Each returns (median ms or None, error).
"""
from __future__ import annotations

import statistics

import numpy as np

from .timing import cuda_ms
from .workloads import build_bench_model, epoch_fn, model_spec


def graph_ms(step, args, comm):
    """Median ms of `step` captured once in a CUDA graph and replayed: (ms, None), or (None, why)
    when the step cannot be captured. At P > 1 the graph holds the NVSHMEM barriers and the
    on-stream gradient reduction too (every rank captures the same step). Adam is capturable
    (its step counts on the GPU) and the bench trains without dropout, so each replay is a
    training step."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            step()
    except Exception as e:  # noqa: BLE001 - the reason is the result
        graph.reset()
        torch.cuda.synchronize()
        return None, f"capture failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    cuda_ms(graph.replay, args.warmup, comm)
    return statistics.median(cuda_ms(graph.replay, args.epochs, comm)), None


def time_system(build_G, mname, g, comm, args, device, graph_row: dict | None = None,
                input_cache: bool | None = None):
    """Median epoch ms of model `mname` over graph wrapper G (None when out of memory). With
    `graph_row` (a dict), also the step captured in a CUDA graph: graph_row["ms"|"error"].
    `input_cache`: the model's first-layer input cache (None: on unless --input-cache off)."""
    import torch

    from mgg.nn.optim import Adam

    try:
        G = build_G()
        x = torch.from_numpy(np.ascontiguousarray(G.local(g.x))).to(device)
        y = torch.from_numpy(np.ascontiguousarray(G.local(g.y))).to(device)
        tm = torch.from_numpy(np.ascontiguousarray(G.local(g.train_mask))).to(device)
        n_train = float(g.train_mask.sum())
        torch.manual_seed(0)
        model = build_bench_model(mname, g, device,
                                  args.input_cache != "off" if input_cache is None else input_cache)
        # the CLI's optimizer; with a CUDA graph its step counts live on the GPU, so each replay
        # is a training step (the bench trains without dropout: no host seed in the step)
        opt = Adam(model.parameters(), lr=0.01, capturable=graph_row is not None)
        step = epoch_fn(model, G, x, y, tm, n_train, opt, comm)
        cuda_ms(step, args.warmup, comm)
        ms = statistics.median(cuda_ms(step, args.epochs, comm))
        err = None
        if graph_row is not None:
            graph_row["ms"], graph_row["error"] = graph_ms(step, args, comm)
    except torch.cuda.OutOfMemoryError as e:
        ms, err = None, f"OOM: {str(e).splitlines()[0][:120]}"
    torch.cuda.empty_cache()
    return ms, err


def plain_torch_epoch(g, mname, args, device, comm):
    """Median epoch ms of the plain torch model a user would write (bench/baselines.py
    PlainTorchGCN/GIN: torch sparse CSR SpMM, the Linears on the narrow side, the last layer on
    the training rows only)."""
    import torch
    import torch.nn.functional as F

    from bench.baselines import plain_torch_model

    m = model_spec(mname)
    try:
        torch.manual_seed(0)
        model, A = plain_torch_model(g, m["name"], m["hidden"], m["layers"], device,
                                     norm=m["options"].get("norm", "none"))
        x = torch.from_numpy(g.x).to(device)
        y = torch.from_numpy(g.y).to(device)
        train = torch.nonzero(torch.from_numpy(g.train_mask).to(device)).reshape(-1)
        A_out = A.rows(train)  # the last layer on the rows the loss reads
        kw = {"out_index": train} if m["name"] == "gin" else {}
        opt = torch.optim.Adam(model.parameters(), lr=0.01)

        def step():
            opt.zero_grad()
            F.cross_entropy(model(x, A, A_out, **kw), y[train]).backward()
            opt.step()
        cuda_ms(step, args.warmup, comm, sync_all=False)
        ms, err = statistics.median(cuda_ms(step, args.epochs, comm, sync_all=False)), None
    except torch.cuda.OutOfMemoryError as e:
        ms, err = None, f"OOM: {str(e).splitlines()[0][:120]}"
    except ValueError as e:  # a model the plain-torch baseline does not have (e.g. gin:layer)
        ms, err = None, str(e)
    torch.cuda.empty_cache()
    return ms, err


def pyg_epoch(g, mname, args, device, comm):
    """Median epoch ms of the same model in PyG (bench/baselines.py PygModel), loss on the
    training rows."""
    import torch
    import torch.nn.functional as F

    from bench.baselines import PygModel

    m = model_spec(mname)
    if m["name"] not in ("gcn", "gin"):
        return None, f"no PyG baseline for {mname}"
    try:
        ei = torch.from_numpy(g.edge_index()).to(device)
        x = torch.from_numpy(g.x).to(device)
        y = torch.from_numpy(g.y).to(device)
        tm = torch.from_numpy(g.train_mask).to(device)
        try:  # mgg's GIN MLP: Linear-[BatchNorm1d]-ReLU-Linear
            model = PygModel(m["name"], g.x.shape[1], m["hidden"], m["layers"], int(g.y.max()) + 1,
                             m["options"].get("norm", "none")).to(device)
        except ImportError:
            return None, "torch_geometric not installed"
        opt = torch.optim.Adam(model.parameters(), lr=0.01)

        def step():
            opt.zero_grad()
            F.cross_entropy(model(x, ei)[tm], y[tm]).backward()
            opt.step()
        cuda_ms(step, args.warmup, comm, sync_all=False)
        ms, err = statistics.median(cuda_ms(step, args.epochs, comm, sync_all=False)), None
    except torch.cuda.OutOfMemoryError as e:
        ms, err = None, f"OOM: {str(e).splitlines()[0][:120]}"
    torch.cuda.empty_cache()
    return ms, err

