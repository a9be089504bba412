"""bench/scaling.py's table from fullgraph result documents (fabricated here; the runs need GPUs)."""
import json

from bench.scaling import main, scaling_rows


def _doc(p, best, nccl=None, nv_bytes=0.0):
    systems = {"mgg-halo": best, "mgg-ptr": best * 1.5, "mgg-pipelined": None}
    if nccl:
        systems["nccl-halo+spmm"] = nccl
    return {"P": p, "bandwidth": {"hbm_GBps": 4000.0, "nvlink_GBps": 400.0 if p > 1 else float("nan")},
            "runs": [{"dataset": "reddit-like", "model": "gcn", "systems": systems,
                      "traffic": {"nvlink_bytes_max_rank": nv_bytes, "nvlink_floor_ms": nv_bytes / 400e6},
                      "memory_mb": {"torch_peak_max_rank": 1000.0 / p, "symmetric_heap_max_rank": 24.0}}]}


def test_rows_speedups_floor_and_memory():
    rows = scaling_rows([_doc(4, 2.5, nccl=6.0, nv_bytes=200e6), _doc(1, 8.0), _doc(2, 4.0, nccl=8.0, nv_bytes=100e6)])
    assert [r["P"] for r in rows] == [1, 2, 4]  # sorted by P, P = 1 first
    r1, r2, r4 = rows
    assert r1["best_variant"] == "mgg-halo" and r1["speedup_vs_P1"] == 1.0 and r1["nccl_ms"] is None
    assert r2["speedup_vs_P1"] == 2.0 and r2["speedup_vs_nccl"] == 2.0 and r2["target"] == 1.8
    assert r4["speedup_vs_P1"] == 8.0 / 2.5 and r4["speedup_vs_nccl"] == 6.0 / 2.5
    assert abs(r4["nvlink_floor_ms"] - 0.5) < 1e-12 and abs(r4["nvlink_mb"] - 200e6 / 2**20) < 1e-9
    assert r4["gpu_mb"] == 250.0 + 24.0


def test_summarize_prints_and_writes(tmp_path, capsys):
    for d in (_doc(1, 8.0), _doc(2, 4.0, nccl=8.0, nv_bytes=1e6)):
        (tmp_path / f"fullgraph-x-P{d['P']}.json").write_text(json.dumps(d))
    assert main(["--summarize", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "reddit-like" in out and "mgg-halo" in out and "2.00" in out
    assert json.loads((tmp_path / "scaling.json").read_text())["rows"][1]["speedup_vs_nccl"] == 2.0


def test_cli_mode_writes_each_order_once_and_counts_remote_rows(tmp_path, capsys, monkeypatch):
    """--cli on a machine without GPUs: the files are written in every order (and reused), the remote
    rows equal rank_footprints', no training runs are attempted."""
    import bench.scaling as scaling
    from bench.scaling_cli import graph_file, remote_rows
    from mgg.data.npz import load_npz
    from mgg.runtime.footprint import rank_footprints

    monkeypatch.setattr(scaling, "_gpus", lambda: 0)
    argv = ["--cli", "--ranks", "1,2", "--datasets", "sbm:0.1", "--orders", "none,degree", "--models", "gcn",
            "--device", "cpu", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "P=1: skipped" in out and "P=2: skipped" in out
    for order in ("none", "degree"):
        path = tmp_path / f"sbm-0.1-{order}.npz"
        g = load_npz(path)
        assert (g.user_ids is not None) == (order == "degree")
        assert remote_rows(str(path), [2])[2] == [f.remote_rows for f in rank_footprints(g.indptr, g.indices, 2)]
        assert graph_file(str(tmp_path), "sbm:0.1", order, "cpu") == (str(path), 0.0)  # reused
    assert json.loads((tmp_path / "scaling-cli.json").read_text())["rows"] == []


def test_cli_table_shows_the_largest_ranks_memory_and_loss(capsys):
    """The --cli table reads the largest rank's peaks from the metrics JSON (GB) and prints them
    beside the final loss; a failed run prints dashes."""
    from bench.scaling_cli import peak_memory_gb, print_cli_table

    doc = {"memory": {"max_gpu_peak_mb": 2816.0, "max_host_peak_mb": 4300.8}}
    assert peak_memory_gb(doc) == {"gpu_peak_gb": 2.75, "host_peak_gb": 4.2}
    assert peak_memory_gb(None) == {"gpu_peak_gb": None, "host_peak_gb": None}
    row = {"dataset": "reddit-like:1", "order": "none", "model": "gcn", "P": 4, "epoch_ms": 1.69,
           "speedup_vs_P1": 2.69, "first_epoch_s": 10.2, "remote_rows_max": 175_000, "val_acc": 0.9989,
           "final_loss": 0.056402, **peak_memory_gb(doc)}
    failed = dict(row, epoch_ms=None, speedup_vs_P1=None, final_loss=None, **peak_memory_gb(None))
    print_cli_table([row, failed])
    lines = capsys.readouterr().out.strip().splitlines()
    assert "GPU GB" in lines[0] and "final loss" in lines[0]
    assert "2.8" in lines[1] and "4.2" in lines[1] and "0.056402" in lines[1]
    assert lines[2].split().count("-") == 5 and len(lines[2]) == len(lines[1])  # aligned dashes
