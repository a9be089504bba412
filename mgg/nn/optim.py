"""Adam for the training loops, without `torch.optim`'s start-up cost.

`torch.optim.Optimizer` wraps `__init__`, `step` and `zero_grad` in `torch._disable_dynamo`, so the
first optimizer a process builds imports `torch._dynamo`: 1.8 s on a 2-core CI box, 3.5 s on the
device machine, on the critical path to the first epoch (the `model` phase), or beside the plan
phase fighting it for the GIL when imported on a thread. This `Adam` is the same algorithm with the
same operations in the same order as `torch.optim.Adam` (L2 `weight_decay` added to the gradient,
bias-corrected moments, `eps` outside the square root; amsgrad, maximize and decoupled decay are not
offered), on multi-tensor `torch._foreach_*` kernels: one launch per operation for all parameters,
as `torch.optim.Adam(foreach=True)`. On CPU its updates are bit-for-bit torch's (tested).

`state_dict()` has torch's layout (`state[i] = {step, exp_avg, exp_avg_sq}`, `param_groups`), so
checkpoints written with either optimizer load into the other.

`capturable=True` keeps each parameter's step count in a float64 scalar tensor on its device and
forms the bias corrections there (torch.optim.Adam(capturable=True)'s scheme, whose float32
corrections drift by 1e-7 per step from the host ones), so a `step()` captured in a CUDA graph
advances the count on every replay instead of replaying the captured step sizes. The update
matches the host form to float32 rounding (tested over 25 steps).
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

__all__ = ["Adam"]


class Adam:
    """Adam over one parameter group.

    Args:
        params: the parameters (float tensors, any device; all updated in place).
        lr: learning rate; betas: (beta1, beta2) in [0, 1); eps > 0 added to the denominator;
        weight_decay >= 0: L2 penalty added to the gradient (torch.optim.Adam's, not AdamW's).
        capturable: step counts and bias corrections on the parameters' devices (no host value
        in `step()`: it can be captured in a CUDA graph and replayed).
    """

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, capturable: bool = False):
        params = list(params)
        if not params:
            raise ValueError("Adam: no parameters to optimize")
        if not lr >= 0.0:
            raise ValueError(f"Adam: lr must be >= 0, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"Adam: betas must lie in [0, 1), got {betas}")
        if not eps > 0.0:
            raise ValueError(f"Adam: eps must be > 0, got {eps}")
        if not weight_decay >= 0.0:
            raise ValueError(f"Adam: weight_decay must be >= 0, got {weight_decay}")
        self.params = params
        self.param_groups = [{"params": params, "lr": float(lr), "betas": (float(betas[0]), float(betas[1])),
                              "eps": float(eps), "weight_decay": float(weight_decay)}]
        self.capturable = bool(capturable)
        self.steps = [0] * len(params)  # host counts (capturable: the device tensors below)
        self.step_t = ([torch.zeros((), dtype=torch.float64, device=p.device) for p in params]
                       if self.capturable else None)
        self.exp_avg = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients (to None, or to zeros in place)."""
        grads = []
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                grads.append(p.grad)
        if grads:
            torch._foreach_zero_(grads)  # one launch a device and dtype, not one a parameter

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        group = self.param_groups[0]
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not live:
            return
        params = [self.params[i] for i in live]
        grads = [self.params[i].grad for i in live]
        m = [self.exp_avg[i] for i in live]
        v = [self.exp_avg_sq[i] for i in live]
        if not self.capturable:
            for i in live:
                self.steps[i] += 1
        if wd != 0:
            grads = torch._foreach_add(grads, params, alpha=wd)
        torch._foreach_lerp_(m, grads, 1 - beta1)
        torch._foreach_mul_(v, beta2)
        torch._foreach_addcmul_(v, grads, grads, 1 - beta2)
        del grads
        if self.capturable:
            self._device_update(params, m, v, [self.step_t[i] for i in live], lr, beta1, beta2, eps)
            return
        step_size = [-(lr / (1 - beta1 ** self.steps[i])) for i in live]
        bc2_sqrt = [(1 - beta2 ** self.steps[i]) ** 0.5 for i in live]  # torch's pow, not sqrt
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, bc2_sqrt)
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(params, m, denom, step_size)

    @staticmethod
    def _device_update(params, m, v, steps, lr: float, beta1: float, beta2: float, eps: float) -> None:
        """p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps), with t the float64
        step tensors (advanced here) and every factor formed on the device."""
        torch._foreach_add_(steps, 1)
        bc1 = torch._foreach_pow(beta1, steps)
        torch._foreach_neg_(bc1)
        torch._foreach_add_(bc1, 1)              # 1 - beta1^t
        step_size = torch._foreach_reciprocal(bc1)
        torch._foreach_mul_(step_size, -lr)      # -lr / (1 - beta1^t)
        bc2 = torch._foreach_pow(beta2, steps)
        torch._foreach_neg_(bc2)
        torch._foreach_add_(bc2, 1)
        torch._foreach_sqrt_(bc2)                # sqrt(1 - beta2^t)
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, bc2)
        torch._foreach_add_(denom, eps)
        upd = torch._foreach_div(m, denom)
        torch._foreach_mul_(upd, step_size)
        torch._foreach_add_(params, upd)

    def _count(self, i: int) -> int:
        return int(self.step_t[i].item()) if self.capturable else self.steps[i]

    def state_dict(self) -> dict[str, Any]:
        """torch.optim.Adam's layout: {"state": {i: {step, exp_avg, exp_avg_sq}}, "param_groups"}."""
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        group.update(amsgrad=False, maximize=False, params=list(range(len(self.params))))
        counts = [self._count(i) for i in range(len(self.params))]
        state = {i: {"step": torch.tensor(float(counts[i])), "exp_avg": self.exp_avg[i],
                     "exp_avg_sq": self.exp_avg_sq[i]}
                 for i in range(len(self.params)) if counts[i] > 0}
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state from `state_dict()` (this class's or torch.optim.Adam's, one group)."""
        groups = state_dict.get("param_groups")
        if not isinstance(groups, list) or len(groups) != 1:
            raise ValueError("Adam.load_state_dict: expected exactly one parameter group")
        g = groups[0]
        if len(g.get("params", ())) != len(self.params):
            raise ValueError(f"Adam.load_state_dict: the state has {len(g.get('params', ()))} parameters, "
                             f"this optimizer {len(self.params)}")
        for flag in ("amsgrad", "maximize", "decoupled_weight_decay"):
            if g.get(flag):
                raise ValueError(f"Adam.load_state_dict: {flag}=True is not supported")
        self.param_groups[0].update(lr=float(g["lr"]), betas=tuple(float(b) for b in g["betas"]),
                                    eps=float(g["eps"]), weight_decay=float(g["weight_decay"]))
        saved = state_dict.get("state", {})
        for pos, key in enumerate(g["params"]):
            s = saved.get(key)
            p = self.params[pos]
            if s is None:
                self.steps[pos] = 0
                if self.capturable:
                    self.step_t[pos].zero_()
                self.exp_avg[pos].zero_()
                self.exp_avg_sq[pos].zero_()
                continue
            for name in ("exp_avg", "exp_avg_sq"):
                if tuple(s[name].shape) != tuple(p.shape):
                    raise ValueError(f"Adam.load_state_dict: {name} of parameter {pos} has shape "
                                     f"{tuple(s[name].shape)}, the parameter {tuple(p.shape)}")
            self.steps[pos] = int(float(s["step"]))
            if self.capturable:
                self.step_t[pos].fill_(float(self.steps[pos]))
            self.exp_avg[pos].copy_(s["exp_avg"])
            self.exp_avg_sq[pos].copy_(s["exp_avg_sq"])
