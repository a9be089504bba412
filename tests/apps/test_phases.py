"""Startup phases and memory in the metrics JSON, and the phase lines rank 0 prints."""
from __future__ import annotations

import json

from mgg.apps.phases import PHASES, process_age_s
from mgg.train import main


def test_phases_and_memory_in_metrics(tmp_path, capsys):
    out = tmp_path / "m.json"
    assert main(["--dataset", "sbm", "--scale", "0.1", "--epochs", "3", "--backend", "cpu",
                 "--metrics-json", str(out)]) == 0
    doc = json.loads(out.read_text())
    ran = [p for p in PHASES if p != "reorder"]  # reorder: asked for, or auto on a larger graph
    assert list(doc["phases"]) == ran  # every phase, in order
    assert all(isinstance(v, float) and v >= 0 for v in doc["phases"].values())
    first = doc["time_to_first_epoch_s"]
    # the phases happen one after another inside the process, before the first epoch ends
    assert sum(doc["phases"].values()) <= first <= process_age_s()
    parts = doc["init_parts_s"]  # the init phase in the steps the app marks, adding up to it
    assert list(parts)[:5] == ["imports", "mpi", "kernel_prebuild", "backend", "memory_check"]
    assert abs(sum(parts.values()) - doc["phases"]["init"]) < 0.02 and parts["imports"] > 0
    peaks = doc["phase_peaks_mb"]  # the peaks so far at each phase's end: never falling
    assert list(peaks) == ran and all(v["gpu"] == 0.0 for v in peaks.values())
    host = [v["host"] for v in peaks.values()]
    assert host == sorted(host) and 10 < host[-1] <= doc["memory"]["max_host_peak_mb"] + 1
    ranks = doc["memory"]["ranks"]
    assert [r["rank"] for r in ranks] == [0] and ranks[0]["host_peak_mb"] > 10
    assert ranks[0]["gpu_peak_mb"] == 0.0 and ranks[0]["sym_mb"] > 0
    assert "evaluation excluded" in doc["epoch_definition"]
    out_text = capsys.readouterr().out
    lines = [ln for ln in out_text.splitlines() if ln.startswith("phase ")]
    assert [ln.split()[1].rstrip(":") for ln in lines] == ran
    assert all("(peak so far: host " in ln for ln in lines)


def test_no_phase_lines_without_progress(tmp_path, capsys):
    assert main(["--dataset", "karate", "--epochs", "2", "--backend", "cpu", "--no-progress"]) == 0
    assert "phase " not in capsys.readouterr().out


def test_reorder_nodes_flag_relabels_before_partitioning(tmp_path):
    out = tmp_path / "m.json"
    assert main(["--dataset", "sbm", "--scale", "0.1", "--epochs", "30", "--backend", "cpu", "--no-progress",
                 "--reorder-nodes", "rcm", "--metrics-json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert "reorder" in doc["phases"] and doc["config"]["reorder_nodes"] == "rcm"
    assert doc["val_acc"] > 0.6  # relabelling does not change what is learnt (sbm, 1,000 nodes)


def test_sampled_mode_reports_its_phases(tmp_path):
    out = tmp_path / "m.json"
    assert main(["--dataset", "sbm", "--scale", "0.1", "--epochs", "2", "--backend", "cpu", "--no-progress",
                 "--mode", "sampled", "--fanout", "5,5", "--batch-size", "64", "--metrics-json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert {"init", "load", "build", "first_epoch"} <= set(doc["phases"])
    assert sum(doc["phases"].values()) <= doc["time_to_first_epoch_s"]


def test_plans_in_metrics_count_every_edge_once(tmp_path):
    """The metrics JSON's `plans`: at one rank every entry is local and nothing is remote; the
    forward and transposed plans each hold every edge of the graph."""
    out = tmp_path / "m.json"
    assert main(["--dataset", "sbm", "--scale", "0.1", "--epochs", "1", "--backend", "cpu", "--no-progress",
                 "--metrics-json", str(out)]) == 0
    doc = json.loads(out.read_text())
    for direction in ("forward", "transposed"):
        p = doc["plans"][direction]
        assert p["local_edges_sum"] == doc["num_edges"] and p["remote_edges_sum"] == 0 and p["halo_rows_max"] == 0
        assert p["n_local_sum"] == doc["num_nodes"]
