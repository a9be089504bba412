"""`--tf32`: float32 matmuls on TF32 tensor cores while training (torch's "high" precision), the
previous precision back afterwards, and the choice recorded in the metrics."""
import json

import pytest
import torch

from mgg.apps.cli import matmul_precision
from mgg.train import main, parse_args


def test_flag_parses_and_defaults_off():
    assert parse_args(["--tf32"]).tf32 is True
    assert parse_args([]).tf32 is False


def test_precision_is_high_inside_and_restored_after_even_on_error():
    before = torch.get_float32_matmul_precision()
    with matmul_precision(False):
        assert torch.get_float32_matmul_precision() == before
    with pytest.raises(RuntimeError, match="boom"):
        with matmul_precision(True):
            assert torch.get_float32_matmul_precision() == "high"
            raise RuntimeError("boom")
    assert torch.get_float32_matmul_precision() == before


def test_training_with_tf32_reports_it_and_restores_the_precision(tmp_path, monkeypatch):
    seen = []
    import mgg.apps.full as full

    real = full.train_full
    monkeypatch.setattr(full, "train_full",
                        lambda *a, **k: seen.append(torch.get_float32_matmul_precision()) or real(*a, **k))
    before = torch.get_float32_matmul_precision()
    out = tmp_path / "m.json"
    assert main(["--tf32", "--epochs", "2", "--backend", "cpu", "--no-progress", "--metrics-json", str(out)]) == 0
    assert seen == ["high"] and torch.get_float32_matmul_precision() == before
    assert json.loads(out.read_text())["config"]["tf32"] is True
