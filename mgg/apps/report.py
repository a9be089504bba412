"""What a training run reports: the metrics JSON and the summary lines rank 0 prints."""
from __future__ import annotations

import math
import sys
from dataclasses import asdict
from typing import Any

import numpy as np

from .config import TrainConfig, TrainResult

__all__ = ["write_metrics", "json_safe", "print_summary", "stopped_message", "sampling_line", "tuning_line"]


def json_safe(v: Any) -> Any:
    """NaN/inf -> None, numpy scalars -> Python, recursively (strict JSON)."""
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


#: what `median_epoch_ms` measures (bench/fullgraph.py times the same section)
EPOCH_DEFINITION = ("one training step between two barriers, the device synchronised: forward (dropout included), "
                    "loss, backward, gradient all-reduce, optimizer step; evaluation excluded")


def write_metrics(path: str, cfg: TrainConfig, graph: Any, res: TrainResult) -> None:
    """Write the metrics JSON atomically (tmp file in the same directory + os.replace)."""
    from ..version import version
    from ..atomic import atomic_write_json

    cfg = cfg.resolved()
    doc = {
        "dataset": getattr(graph, "name", cfg.dataset) or cfg.dataset,
        "model": cfg.model,
        "world_size": res.world_size,
        "backend": res.backend,
        "storage_dtype": cfg.storage_dtype,
        "tf32": cfg.tf32,
        "num_nodes": int(len(graph.indptr) - 1),
        "num_edges": int(graph.indptr[-1]),
        "train_acc": res.train_acc,
        "val_acc": res.val_acc,
        "test_acc": res.test_acc,
        "final_loss": res.final_loss,
        "median_epoch_ms": res.median_epoch_ms,
        "epochs": res.epochs,
        "tuner": res.tuning,
        "mode": res.mode,
        "config": asdict(cfg),
        "version": version(),
    }
    if res.sampling:
        doc["sampling"] = res.sampling
    doc["epoch_definition"] = EPOCH_DEFINITION
    if res.phases:
        doc["phases"] = res.phases
        doc["phase_peaks_mb"] = res.phase_peaks_mb
        doc["init_parts_s"] = res.init_parts_s
        doc["time_to_first_epoch_s"] = res.time_to_first_epoch_s
    if res.memory:
        doc["memory"] = res.memory
    if res.step_profile:
        doc["step_profile_ms"] = res.step_profile
    if res.cuda_graph:
        doc["cuda_graph"] = res.cuda_graph
    if res.plans:
        doc["plans"] = res.plans
    if res.row_sets:
        doc["row_sets"] = res.row_sets
    if res.kernels:
        doc["kernels"] = res.kernels
    if hasattr(graph, "fingerprint"):
        doc["fingerprint"] = graph.fingerprint()
    atomic_write_json(path, json_safe(doc), indent=2)


def stopped_message(res: TrainResult, epochs: int) -> str:
    """The stderr line of a run that a signal stopped after a checkpoint (or with nothing saved)."""
    done = res.epochs[-1]["epoch"]
    saved = (f"checkpoint {res.checkpoint} written at epoch {done}; continue with --resume auto"
             if res.checkpoint else "no --checkpoint-dir, nothing saved")
    return f"mgg.train: {res.stopped} received: stopped after epoch {done} of {epochs}; {saved}"


def print_summary(cfg: TrainConfig, graph: Any, res: TrainResult, world_size: int) -> None:
    """The final lines of a finished run (rank 0): dataset, accuracies, loss and epoch time,
    the sampling totals (--mode sampled) and the kernel configuration."""
    r = cfg.resolved()
    print(f"dataset={getattr(graph, 'name', cfg.dataset)} nodes={len(graph.indptr) - 1} "
          f"edges={int(graph.indptr[-1])} model={r.model} ranks={world_size} backend={res.backend} "
          f"epochs={r.epochs}" + (f" mode={res.mode}" if res.mode != "full" else ""))
    print(f"train_acc={res.train_acc:.4f} val_acc={res.val_acc:.4f} test_acc={res.test_acc:.4f}")
    print(f"final_loss={res.final_loss:.6f} median_epoch_ms={res.median_epoch_ms:.3f}", flush=True)
    if res.sampling:
        print(sampling_line(res.sampling), flush=True)
    print(tuning_line(res.tuning), flush=True)


def _mb(b: float) -> str:
    return f"{b / 2**20:.2f}MiB"


def sampling_line(s: dict) -> str:
    """One summary line of a sampled run (printed by rank 0)."""
    line = (f"sampling: fanout={','.join(map(str, s['fanout']))} batch_size={s['batch_size']} "
            f"global_batch={s.get('global_batch_size', s['batch_size'])} "
            f"steps_per_epoch={s['steps_per_epoch']} features={s['feature_tier']} reorder={s['reorder']} "
            f"fetched={_mb(s['bytes_fetched_total'])} (remote {_mb(s['bytes_remote_total'])}; "
            f"without reuse {_mb(s['bytes_no_reuse_total'])}")
    if "bytes_identity_order_total" in s:
        line += f"; reuse without reorder {_mb(s['bytes_identity_order_total'])}"
    line += f") rows_reused={s['rows_reused_total']}"
    if s.get("sampled_edges_per_s") is not None:
        line += (f" sampled_edges={s['edges_total']} sample_rate={s['sampled_edges_per_s'] / 1e6:.2f}M edges/s "
                 f"per rank")
    return line


def tuning_line(t: dict) -> str:
    """`config: ps=.. dist=.. wpb=.. variant=..` plus, with --tune, how it was found."""
    c = t["config"]
    line = f"ps={c['ps']} dist={c['dist']} wpb={c['wpb']}"
    if c.get("ps_inter") is not None:
        line += f" ps_inter={c['ps_inter']}"
    line += f" variant={c['variant']}"
    if not t.get("enabled"):
        return f"config: {line} (fixed)"
    state = "from cache" if t["from_cache"] else ("done" if t["done"] else "still searching")
    return f"tuner: {line} search_iterations={t['search_iterations']} ({state})"


def print_stopped(res: TrainResult, epochs: int) -> None:
    """Write `stopped_message` to stderr."""
    sys.stderr.write(stopped_message(res, epochs) + "\n")
    sys.stderr.flush()
