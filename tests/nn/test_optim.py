"""mgg.nn.optim.Adam: torch.optim.Adam's updates bit for bit on CPU, its state_dict layout both ways,
clear errors, and no torch._dynamo import."""
import subprocess
import sys

import pytest
import torch

from mgg.nn.optim import Adam


def _pair(wd, dtype=torch.float32):
    g = torch.Generator().manual_seed(3)
    ps = [torch.randn(6, 4, generator=g, dtype=dtype).requires_grad_(), torch.randn(9, generator=g, dtype=dtype).requires_grad_()]
    qs = [p.detach().clone().requires_grad_() for p in ps]
    return ps, qs, Adam(ps, lr=0.02, weight_decay=wd), torch.optim.Adam(qs, lr=0.02, weight_decay=wd)


@pytest.mark.parametrize("wd", [0.0, 5e-4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adam_matches_torch_bitwise(wd, dtype):
    ps, qs, ours, ref = _pair(wd, dtype)
    g = torch.Generator().manual_seed(7)
    for it in range(25):
        for p, q in zip(ps, qs):
            grad = torch.randn(p.shape, generator=g, dtype=dtype)
            p.grad, q.grad = grad.clone(), grad.clone()
        if it in (4, 11):  # a parameter without a gradient is skipped, its step count stays
            ps[1].grad = qs[1].grad = None
        ours.step()
        ref.step()
        for p, q in zip(ps, qs):
            assert torch.equal(p, q), it
    assert ours.steps == [25, 23]


@pytest.mark.parametrize("wd", [0.0, 5e-4])
def test_capturable_adam_matches_to_float32_rounding(wd):
    """capturable=True: step counts and bias corrections as float64 device tensors (no host value
    in step()); the updates are torch's to float32 rounding, the counts and state_dict the same."""
    ps, qs, _, ref = _pair(wd)
    ours = Adam(ps, lr=0.02, weight_decay=wd, capturable=True)
    g = torch.Generator().manual_seed(7)
    for it in range(25):
        for p, q in zip(ps, qs):
            grad = torch.randn(p.shape, generator=g)
            p.grad, q.grad = grad.clone(), grad.clone()
        if it in (4, 11):
            ps[1].grad = qs[1].grad = None
        ours.step()
        ref.step()
        for p, q in zip(ps, qs):
            assert torch.allclose(p, q, rtol=1e-6, atol=1e-6), it  # steps are 0.02
    assert [float(t) for t in ours.step_t] == [25.0, 23.0] and ours.steps == [0, 0]
    sd = ours.state_dict()
    assert [float(sd["state"][i]["step"]) for i in (0, 1)] == [25.0, 23.0]
    other = Adam([p.detach().clone() for p in ps], capturable=True)
    other.load_state_dict(ref.state_dict())
    assert [float(t) for t in other.step_t] == [25.0, 23.0]
    # lr = 0 leaves the parameters as they are
    frozen = [torch.randn(3).requires_grad_()]
    before = frozen[0].detach().clone()
    z = Adam(frozen, lr=0.0, capturable=True)
    frozen[0].grad = torch.ones(3)
    z.step()
    assert torch.equal(frozen[0].detach(), before)


def test_state_dict_round_trips_with_torch():
    ps, qs, ours, ref = _pair(1e-3)
    for _ in range(3):
        for p, q in zip(ps, qs):
            p.grad = torch.ones_like(p)
            q.grad = torch.ones_like(q)
        ours.step()
        ref.step()
    # torch's state into ours, then both go on: still equal
    fresh = [p.detach().clone().requires_grad_() for p in qs]
    mine = Adam(fresh, lr=0.5)
    mine.load_state_dict(ref.state_dict())
    assert mine.param_groups[0]["lr"] == 0.02 and mine.steps == [3, 3]
    # ours into torch's
    back = torch.optim.Adam([p.detach().clone().requires_grad_() for p in ps], lr=0.5)
    back.load_state_dict(ours.state_dict())
    for a, b in zip(back.state.values(), ref.state.values()):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and float(a["step"]) == float(b["step"])
    for p, q in zip(fresh, qs):
        p.grad = torch.full_like(p, 0.3)
        q.grad = torch.full_like(q, 0.3)
    mine.step()
    ref.step()
    assert all(torch.equal(p, q) for p, q in zip(fresh, qs))


def test_zero_grad_and_errors():
    p = torch.zeros(3, requires_grad=True)
    opt = Adam([p])
    p.grad = torch.ones(3)
    opt.zero_grad(set_to_none=False)
    assert torch.equal(p.grad, torch.zeros(3))
    opt.zero_grad()
    assert p.grad is None
    with pytest.raises(ValueError, match="lr"):
        Adam([p], lr=-1)
    with pytest.raises(ValueError, match="no parameters"):
        Adam([])
    with pytest.raises(ValueError, match="2 parameters, this optimizer 1"):
        Adam([p]).load_state_dict({"state": {}, "param_groups": [{"params": [0, 1], "lr": 1, "betas": (0.9, 0.9),
                                                                   "eps": 1e-8, "weight_decay": 0}]})
    with pytest.raises(ValueError, match="amsgrad"):
        Adam([p]).load_state_dict({"state": {}, "param_groups": [{"params": [0], "lr": 1, "betas": (0.9, 0.9),
                                                                   "eps": 1e-8, "weight_decay": 0, "amsgrad": True}]})


def test_training_imports_no_dynamo():
    code = ("import sys, torch; from mgg.nn.optim import Adam; p = torch.zeros(2, requires_grad=True); "
            "o = Adam([p]); p.sum().backward(); o.step(); o.zero_grad(); print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
