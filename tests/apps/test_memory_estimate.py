"""One memory estimate: what `python -m mgg.prepare FILE --ranks P` prints is what `mgg.train`
checks for that file and P, and the README's larger-than-one-host example fits the host memory
the README states."""
import re

import numpy as np
import pytest

from mgg.apps import memory_check
from mgg.apps.memory_check import GraphSize, check_memory, estimate, graph_size
from mgg.apps.prepare_cli import main as prepare_main
from mgg.data import Graph
from mgg.data.generators import PRESETS, preset_sizes
from mgg.data.npz import save_npz

from mgg.testing.paths import ROOT

GIB = 2**30


def _labelled_file(tmp_path, classes: int):
    rng = np.random.default_rng(0)
    n, e = 300, 3000
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rng.integers(0, n, e), minlength=n))]).astype(np.int64)
    indices = rng.integers(0, n, e).astype(np.int64)
    y = rng.integers(0, classes, n).astype(np.int64)
    y[:classes] = np.arange(classes)  # every class occurs: max label + 1 classes
    path = tmp_path / "g.npz"
    save_npz(Graph(indptr, indices, rng.standard_normal((n, 24)).astype(np.float32), y), path)
    return str(path)


def test_prepare_prints_the_estimate_train_checks(tmp_path, capsys, monkeypatch):
    path = _labelled_file(tmp_path, classes=90)  # more than the 64 classes assumed before loading
    monkeypatch.setenv("MGG_MEMORY_AVAILABLE", "1")  # every check refuses: its message has the figure
    assert prepare_main([path, "--ranks", "2,3", "--hidden", "32"]) == 0
    out = capsys.readouterr().out
    lines = re.findall(r"mgg\.train estimate \(cpu backend, 2 layers of 32, 90 classes\): ([\d.]+) GiB host a rank, "
                       r"([\d.]+) GiB for (\d) rank\(s\) on one node", out)
    assert [int(p) for _, _, p in lines] == [2, 3], out
    for rank_gib, node_gib, p in lines:
        why = check_memory(path, 1.0, 32, 2, int(p), int(p), False, classes=90)
        assert f"about {node_gib} GiB needed on this node ({rank_gib} GiB per rank x {p})" in why
        exact = estimate(graph_size(path), 32, 2, int(p), False, "full", 90).host_per_rank
        assert rank_gib == f"{exact / GIB:.1f}"


def test_a_file_is_refused_with_what_works_for_a_file(tmp_path, monkeypatch):
    path = _labelled_file(tmp_path, classes=5)
    monkeypatch.setenv("MGG_MEMORY_AVAILABLE", "1")
    why = check_memory(path, 1.0, 16, 2, 4, 4, False)
    assert "fewer ranks on this node (more nodes)" in why and "python -m mgg.prepare" in why and "--force" in why
    assert "--scale" not in why.replace("mgg.prepare PRESET --scale S", "")  # a file takes no --scale
    assert "a smaller --scale" in check_memory("papers-like", 0.5, 16, 2, 4, 4, False)


def test_the_readme_example_fits_the_memory_the_readme_states():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Graphs larger than one host"):]
    section = section[: section.index("\n## ", 5)]
    scale = float(re.search(r"mgg\.prepare papers-like --scale ([\d.]+) --out papers\.npz --ranks (\d)", section)[1])
    ranks = int(re.search(r"launch/mpirun\.sh -np (\d) --dataset papers\.npz", section)[1])
    budget = float(re.search(r"need about ([\d.]+) GiB of host memory", section)[1])
    n, e = preset_sizes("papers-like", scale)
    preset = PRESETS["papers-like"]
    size = GraphSize(n, e, preset.num_features, mapped=True)  # mgg.prepare writes a mapped CSR file
    est = estimate(size, 16, 2, ranks, False, "full", preset.num_classes)
    assert est.host_per_rank * ranks <= budget * GIB
    assert est.host_per_rank * ranks >= 0.8 * budget * GIB  # the README's figure is the estimate's, not a guess
    # and the check accepts it on a host with that much available
    assert memory_check.estimate(size, 16, 2, ranks, False, "full", preset.num_classes) == est


def test_the_readme_example_is_accepted_on_the_stated_budget(tmp_path, monkeypatch):
    """A small file written by mgg.prepare is a mapped file: the README example's check path."""
    rc = prepare_main(["papers-like", "--scale", "0.0005", "--out", str(tmp_path / "p.npz"), "--reorder-nodes", "none"])
    assert rc == 0
    size = graph_size(str(tmp_path / "p.npz"))
    assert size.mapped and size.features == PRESETS["papers-like"].num_features
    need = estimate(size, 16, 2, 4, False, "full", 64).host_per_rank * 4
    monkeypatch.setenv("MGG_MEMORY_AVAILABLE", str(need))
    assert check_memory(str(tmp_path / "p.npz"), 1.0, 16, 2, 4, 4, False) == ""
    monkeypatch.setenv("MGG_MEMORY_AVAILABLE", str(need - 1))
    assert check_memory(str(tmp_path / "p.npz"), 1.0, 16, 2, 4, 4, False) != ""


#: torch's peak allocation (MiB, largest rank) of `python -m mgg.train --dataset FILE --model M` with
#: default flags on 4x H200 (bench/results/2026-11-28-h200x4-71eded6): (nodes, edges, features,
#: classes, model, P, peak)
GPU_PEAKS = [
    (232965, 114615892, 602, 41, "gcn", 1, 7459.0), (232965, 114615892, 602, 41, "gcn", 4, 2755.4),
    (232965, 114615892, 602, 41, "gin", 1, 7459.0), (232965, 114615892, 602, 41, "gin", 4, 2755.4),
    (2449029, 61859140, 100, 47, "gcn", 1, 4507.8), (2449029, 61859140, 100, 47, "gcn", 4, 1535.7),
    (2449029, 61859140, 100, 47, "gin", 1, 11768.0), (2449029, 61859140, 100, 47, "gin", 4, 3534.8),
    (33317987, 484705762, 128, 172, "gcn", 1, 57513.4), (33317987, 484705762, 128, 172, "gcn", 4, 19034.1),
    (33317987, 484705762, 128, 172, "gin", 4, 53800.1),
]
WIDTHS = {"gcn": (16, 2), "gin": (64, 5)}


@pytest.mark.parametrize("nodes,edges,features,classes,model,ranks,peak_mib", GPU_PEAKS)
def test_gpu_estimate_tracks_measured_peaks(nodes, edges, features, classes, model, ranks, peak_mib):
    hidden, layers = WIDTHS[model]
    est = estimate(GraphSize(nodes, edges, features, mapped=True), hidden, layers, ranks, True, classes=classes)
    assert 0.95 <= est.gpu_per_rank / (peak_mib * 2**20) <= 1.3


def test_a_run_that_fits_one_h200_is_not_refused(tmp_path, monkeypatch):
    """papers-like@0.3 GCN (33M nodes, 485M edges) trained on one H200 with a peak of 57,513 MiB;
    GIN 5x64 needs about 4 x the 53,800 MiB a rank it took at P = 4 and is refused."""
    monkeypatch.setenv("MGG_MEMORY_AVAILABLE", str(500 * 2**30))
    size = GraphSize(33317987, 484705762, 128, mapped=True)
    free = int(139.3 * 2**30)
    assert check_memory("papers.npz", 1.0, 16, 2, 1, 1, True, free, classes=172, size=size) == ""
    why = check_memory("papers.npz", 1.0, 64, 5, 1, 1, True, free, classes=172, size=size)
    assert why.startswith("not enough GPU memory")
