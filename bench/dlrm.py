"""DLRM training-step benchmark: mgg's sharded tables vs the torch.distributed all-to-all design.

    mpirun -np 2 python bench/dlrm.py                                   # CPU (MPI store, gloo)
    mpirun -np 4 python bench/dlrm.py --backend gpu --max-rows 0 --json dlrm-gpu-p4.json

The model is `mgg.embedding.dlrm_model` (bottom MLP 13-64-D, T Criteo Kaggle tables capped at
--max-rows, dot interaction, top MLP 256-64-1, BCE), the data `mgg.embedding.dlrm_data` (Zipf
ids, labels from a hidden teacher), B = --batch-size samples per rank. Two complete training
steps train it from the same seeded weights on the same batches with the same hyperparameters:

* ``mgg``: `mgg.embedding.dlrm_train.MggDLRM` -- the tables in one `MultiTableEmbeddingBag`
  (unique rows read one-sided from their owners: MPI RMA on the CPU, NVSHMEM on the GPU),
  row gradients sent to the owners, row-wise Adagrad there; MLP gradients summed with
  `mgg.nn.ddp.allreduce_gradients`.
* ``a2a``: bench/dlrm_a2a.py's `AllToAllDLRM` -- row-wise shards as plain torch tensors, unique
  ids all-to-all to their owners, rows all-to-all back, gradients all-to-all to the owners, the
  same row-wise Adagrad; MLP gradients in one all_reduce (torch.distributed: NCCL on the GPU,
  gloo on the CPU).
* ``torchrec``: the sharded EmbeddingBagCollection; a row saying why it was not run when torchrec
  or fbgemm-gpu cannot be imported.

Before timing, both run --check-steps steps and their global losses must agree to --loss-rtol;
otherwise the bench prints the two loss sequences and exits 1 without timing anything. Then
each runs --warmup + --steps steps; a step's time is the max over ranks of forward + backward +
optimizer (ranks start together after a barrier; GPU synchronised; the designs take turns step
by step), the table shows the medians and a2a/mgg. --json writes the results (host, P, configuration, per-step times, check losses).

On the GPU store mgg's step is replayed from a CUDA graph after its warm-up (MggDLRM's default,
mgg.embedding.dlrm_graphed; `--no-cuda-graph` runs it eagerly); the table and the JSON's "graph"
say whether it was (captured, replays, eager steps, and why not). The a2a design stays eager.
"""
from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mgg.atomic import atomic_write_json  # noqa: E402
from mgg.embedding.dlrm_data import DLRMBatches  # noqa: E402
from mgg.embedding.dlrm_model import CRITEO_KAGGLE, DLRMConfig  # noqa: E402
from mgg.runtime import world  # noqa: E402

DESIGNS = ("mgg", "a2a")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--steps", type=int, default=20, help="timed steps per design")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per design before the timed ones")
    p.add_argument("--check-steps", type=int, default=3, help="steps whose losses must agree before timing")
    p.add_argument("--loss-rtol", type=float, default=1e-4, help="relative tolerance of the loss check")
    p.add_argument("--batch-size", type=int, default=2048, help="samples per rank per step")
    p.add_argument("--tables", type=int, default=26, help=f"number of Criteo Kaggle tables (1..{len(CRITEO_KAGGLE)})")
    p.add_argument("--max-rows", type=int, default=200_000, help="cap on each table's rows (0: full Kaggle sizes)")
    p.add_argument("--dim", type=int, default=16, help="embedding dim (= bottom MLP output)")
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument("--lr", type=float, default=0.1, help="MLP SGD learning rate")
    p.add_argument("--emb-lr", type=float, default=0.1, help="row-wise Adagrad learning rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-cuda-graph", action="store_true", help="run mgg's GPU step eagerly (no CUDA graph)")
    p.add_argument("--json", default=None, help="write the results here (JSON)")
    args = p.parse_args(argv)
    for name in ("steps", "batch_size", "dim", "check_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0 or args.max_rows < 0 or not args.loss_rtol > 0:
        p.error("--warmup and --max-rows must be >= 0, --loss-rtol > 0")
    if not 1 <= args.tables <= len(CRITEO_KAGGLE):
        p.error(f"--tables must be in [1, {len(CRITEO_KAGGLE)}]")
    return args


def init_torch_distributed(comm, backend: str) -> torch.device:
    """The default process group of the all-to-all design over the same ranks: NCCL on the GPU
    (one GPU a rank), gloo on the CPU; returns this rank's device."""
    import torch.distributed as tdist

    if backend == "gpu":
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        dev = torch.device("cpu")
    addr = comm.bcast(socket.gethostbyname(socket.gethostname()) if comm.rank == 0 else None)
    port = comm.bcast(_free_port() if comm.rank == 0 else None)
    kw = {"device_id": dev} if backend == "gpu" else {}
    tdist.init_process_group("nccl" if backend == "gpu" else "gloo", init_method=f"tcp://{addr}:{port}",
                             rank=comm.rank, world_size=comm.size, **kw)
    return dev


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def torchrec_status() -> str | None:
    """None when torchrec and fbgemm-gpu import; else why not (one line)."""
    try:
        import fbgemm_gpu  # noqa: F401
        import torchrec  # noqa: F401
    except Exception as e:  # noqa: BLE001 - an import of a compiled extension can fail in many ways
        return f"not installed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return None


def run_steps(model, batches: DLRMBatches, steps: int, device, comm) -> list[float]:
    """`steps` training steps; the global loss of each (summed over ranks)."""
    out = []
    for _ in range(steps):
        loss = model.step(batches.next().to(device))
        out.append(comm.allreduce_scalar(float(loss)))
    return out


def losses_disagree(a: list[float], b: list[float], rtol: float) -> str | None:
    """None when every step's losses agree to rtol; else a line naming the first step that does not."""
    for i, (x, y) in enumerate(zip(a, b)):
        if not abs(x - y) <= rtol * max(abs(x), abs(y)):
            return f"step {i + 1}: mgg loss {x:.8f}, a2a loss {y:.8f} (|diff| {abs(x - y):.2e} > rtol {rtol:g})"
    return None


def graph_status(model) -> dict:
    """Whether mgg's step was replayed from a CUDA graph: captured, replays, eager_steps, why_eager."""
    g = getattr(model, "graphed", None)
    if g is None:
        return {"captured": False, "replays": 0, "eager_steps": None, "why_eager": "off (CPU store or --no-cuda-graph)"}
    return {"captured": g.captured, "replays": g.replays, "eager_steps": g.eager_steps, "why_eager": g.why_eager}


def time_steps(models: dict, streams: dict, warmup: int, steps: int, device, comm) -> dict[str, list[float]]:
    """Seconds of each timed step of every design, the max over ranks (barrier before, GPU
    synchronised after). The designs take turns step by step, so a change in the machine's load
    falls on both alike."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out: dict[str, list[float]] = {k: [] for k in models}
    for i in range(warmup + steps):
        for k, model in models.items():
            b = streams[k].next().to(device)
            sync()
            comm.barrier()
            t0 = time.perf_counter()
            model.step(b)
            sync()
            dt = comm.allreduce_scalar(time.perf_counter() - t0, "max")
            if i >= warmup:
                out[k].append(dt)
    return out


def run(args) -> dict | None:
    """The benchmark (collective); the results on every rank, None when the loss check failed."""
    from bench.dlrm_a2a import AllToAllDLRM
    from mgg.embedding.dlrm_train import MggDLRM
    from mgg.graph import make_store

    comm = world()
    if args.backend == "gpu":
        if not torch.cuda.is_available():
            raise SystemExit("bench/dlrm.py: --backend gpu needs a CUDA GPU (torch.cuda.is_available() is False)")
        torch.cuda.set_device(comm.local_rank % torch.cuda.device_count())
    cfg = DLRMConfig.criteo(args.max_rows, args.tables, dim=args.dim, zipf=args.zipf, lr=args.lr,
                            emb_lr=args.emb_lr, seed=args.seed)
    t0 = time.perf_counter()
    store = make_store(comm, args.backend)
    device = init_torch_distributed(comm, args.backend)
    models = {"mgg": MggDLRM(cfg, comm, store, cuda_graph=False if args.no_cuda_graph else None),
              "a2a": AllToAllDLRM(cfg, device)}
    P, B = comm.size, args.batch_size
    if comm.rank == 0:
        print(f"DLRM step: P={P} ({args.backend}), {cfg.num_tables} tables ({sum(cfg.cards):,} rows x {cfg.dim}, "
              f"row-wise sharded), batch {B}/rank (global {B * P}), setup {time.perf_counter() - t0:.1f}s", flush=True)
    try:
        streams = {k: DLRMBatches(cfg, B, comm.rank) for k in DESIGNS}
        check = {k: run_steps(models[k], streams[k], args.check_steps, device, comm) for k in DESIGNS}
        bad = losses_disagree(check["mgg"], check["a2a"], args.loss_rtol)
        if bad is not None:
            if comm.rank == 0:
                print(f"bench/dlrm.py: the two designs do not train the same model -- {bad}; no timings printed\n"
                      f"  mgg losses: {check['mgg']}\n  a2a losses: {check['a2a']}", file=sys.stderr, flush=True)
            return None
        times = time_steps(models, streams, args.warmup, args.steps, device, comm)
        graph = graph_status(models["mgg"])  # before free() releases the graph
    finally:
        models["mgg"].free()
        import torch.distributed as tdist

        tdist.destroy_process_group()
    med = {k: float(np.median(v)) for k, v in times.items()}
    tr = torchrec_status()
    return {"bench": "dlrm-step", "backend": args.backend, "P": P, "batch_per_rank": B, "global_batch": B * P,
            "tables": list(cfg.cards), "dim": cfg.dim, "bot": cfg.bot_sizes, "top": cfg.top_sizes, "zipf": cfg.zipf,
            "lr": cfg.lr, "emb_lr": cfg.emb_lr, "seed": cfg.seed, "check_losses": check, "loss_rtol": args.loss_rtol,
            "warmup": args.warmup, "steps": args.steps, "step_s": times, "median_s": med,
            "samples_per_s": {k: B * P / v for k, v in med.items()},
            "ratio_a2a_over_mgg": med["a2a"] / med["mgg"], "graph": graph,
            "torchrec": {"run": False, "reason": tr} if tr else {"run": False, "reason": "installed; no design written"},
            "host": socket.gethostname(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if args.backend == "gpu" else None,
            "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


def print_table(r: dict) -> None:
    print(f"\nDLRM training step, P={r['P']} ({r['backend']}{', ' + r['gpu'] if r['gpu'] else ''}), "
          f"{len(r['tables'])} tables x {r['dim']}, batch {r['batch_per_rank']}/rank, median of {r['steps']} steps "
          f"(losses agreed over {len(r['check_losses']['mgg'])} steps, rtol {r['loss_rtol']:g})")
    print(f"{'design':<9} {'step ms':>9} {'samples/s':>11} {'vs mgg':>7}")
    for k in DESIGNS:
        m = r["median_s"][k]
        print(f"{k:<9} {m * 1e3:9.2f} {r['samples_per_s'][k]:11.0f} {m / r['median_s']['mgg']:6.2f}x")
    print(f"{'torchrec':<9} {'-':>9} {'-':>11} {'-':>7}  {r['torchrec']['reason']}")
    g = r["graph"]
    print(f"mgg step: replayed from a CUDA graph ({g['replays']} replays, {g['eager_steps']} eager steps)" if g["captured"]
          else f"mgg step: eager ({g['why_eager']})")
    print(f"a2a/mgg = {r['ratio_a2a_over_mgg']:.2f}", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    r = run(args)
    if r is None:
        return 1
    if world().rank == 0:
        print_table(r)
        if args.json:
            atomic_write_json(args.json, r)
            print(f"wrote {args.json}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
