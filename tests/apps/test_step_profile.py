"""--profile-steps: the parts of every training step in the metrics JSON (mgg.apps.step_profile)."""
import json
import time

import pytest

from mgg.apps.step_profile import PARTS, StepProfile
from mgg.runtime import Communicator
from mgg.train import main


class _Graph:
    def aggregate(self, x, kind, transposed=False):
        time.sleep(0.004 if transposed else 0.002)
        return x


def test_spans_add_up_and_only_steps_count():
    prof, dg = StepProfile(cuda=False), _Graph()
    prof.attach(dg)
    dg.aggregate(1, "sum")  # outside a step (evaluation): not counted
    for _ in range(3):
        with prof.step():
            with prof.span("forward"):
                dg.aggregate(1, "sum")
                dg.aggregate(1, "sum")
            with prof.span("backward"):
                dg.aggregate(1, "sum", transposed=True)
            with prof.span("optimizer"):
                pass
    prof.detach()
    assert dg.aggregate.__func__ is _Graph.aggregate  # unwrapped
    s = prof.summary(Communicator())
    assert s["steps"] == 3 and set(PARTS) <= set(s)
    assert 4.0 <= s["aggregate"] <= s["forward"] and 4.0 <= s["aggregate_t"] <= s["backward"]
    assert s["allreduce"] == 0.0 and s["dense"] >= 0.0
    assert abs(s["step"] - (s["forward"] + s["backward"] + s["optimizer"])) < 1.0


def test_cli_writes_the_profile(tmp_path):
    out = tmp_path / "m.json"
    assert main(["--dataset", "sbm", "--scale", "0.1", "--epochs", "6", "--backend", "cpu", "--no-progress",
                 "--profile-steps", "--metrics-json", str(out)]) == 0
    prof = json.loads(out.read_text())["step_profile_ms"]
    assert prof["steps"] == 6 and prof["aggregate"] > 0 and prof["aggregate_t"] > 0
    assert prof["aggregate"] <= prof["forward"] and prof["aggregate_t"] <= prof["backward"]
    out2 = tmp_path / "n.json"
    assert main(["--dataset", "sbm", "--scale", "0.1", "--epochs", "2", "--backend", "cpu", "--no-progress",
                 "--metrics-json", str(out2)]) == 0
    assert "step_profile_ms" not in json.loads(out2.read_text())


def test_sampled_mode_refuses(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--mode", "sampled", "--profile-steps", "--epochs", "1", "--backend", "cpu"])
    assert e.value.code == 2 and "--profile-steps" in capsys.readouterr().err
