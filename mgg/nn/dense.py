"""Dense projections of tall node matrices: x [N, F] @ W^T with N in the millions.

autograd's backward of `x @ W.t()` computes the weight gradient as x^T G ([F, N] @ [N, O]) and
transposes it; cuBLAS runs that float32 GEMM with its reduction over all N rows as a slow SIMT
kernel. G^T x ([O, N] @ [N, F]) is the same matrix, transposed, and cuBLAS runs it much faster.
Measured on one H200 (papers-like@0.1 layer 1: N = 11.1M, F = 128, O = 16; bench/projection.py):
autograd's whole backward 5.01 ms, x^T G 3.09 ms, G^T x 2.26 ms, reading x and G once 1.33 ms
(a batched GEMM over row blocks plus a sum took 3.54 ms: not used). `project` is `x @ W^T` with
that backward; the result equals autograd's up to float32 summation order.

`linear_relu` is relu(x W^T + b) with the ReLU in the GEMM's epilogue (torch._addmm_activation,
cuBLASLt): on one H200 at [2.45M, 64] x [64, 64] it takes 0.713 ms, the same as the GEMM with its
bias alone (0.711), where the GEMM then a ReLU pass take 1.026 ms (bench/results/
2026-11-26-h200x1-40dc2d0/c9/gemm_probe.py). Its backward is autograd's (the ReLU's gradient from
its output), with the G^T x weight gradient; on a GPU the ReLU's mask and the bias gradient run
in one pass (mgg/kernels/relu_grad.cu: threshold_backward 0.452 ms + the bias sum 0.250 ms there),
and where the tall-GEMM kernels take the widths, inside the weight gradient's kernel
(mgg.kernels.tall_gemm.relu_weight_grad: it reads g and y, writes the masked g and sums it).

`dropout_project` goes further for an input layer that starts with dropout: the hash dropout
(mgg.nn.functional.global_dropout's mask, bit for bit) runs inside the projection kernel and its
weight-gradient kernel (mgg/kernels/dropout_project.cu), so the dropped input is never written
nor read back: on papers-like@0.1 it replaces a dropout pass (write and read of 5.7 GB) and two
GEMMs.

x W^T and G W of a tall float32 CUDA matrix with narrow sides (`tall_gemm`: inner width a
multiple of 4 up to 128, outer width even up to 64, as GIN's 64-wide MLPs and a 100-wide first
layer) run on
mgg/kernels/tall_gemm.cu: TF32 tensor cores with the 3xTF32 split, which keeps float32's
accuracy. cuBLAS runs these float32 GEMMs on the SIMT units: on one H200 at [2.45M, 64] x
[64, 64], 0.67-0.69 ms against the kernel's 0.47-0.55 (bench/dense_gemm.py); the weight
gradient G^T x takes its own kernel of the same file where both widths are multiples of 4 up to
64. `MGG_TALL_GEMM=0`, or torch's TF32 matmuls (`--tf32`), keep cuBLAS everywhere. `linear` is
F.linear with all of the above.
"""
from __future__ import annotations

import torch

__all__ = ["project", "dropout_project", "fused_input_projection", "linear", "linear_relu", "linear_with_stats",
           "tall_gemm", "TALL_ROWS", "TALL_GEMM_ROWS"]

#: inputs with at least this many rows (on CUDA) take the custom backward
TALL_ROWS = 1 << 20
#: float32 CUDA matrices with at least this many rows take mgg/kernels/tall_gemm.cu (`tall_gemm`)
TALL_GEMM_ROWS = 1 << 16


def _custom_backward(x: torch.Tensor) -> bool:
    """Whether x (2-D, on CUDA) is tall enough for the autograd functions here (the G^T x weight
    gradient, the tall-GEMM kernels): >= TALL_GEMM_ROWS or TALL_ROWS rows, the smaller."""
    return x.is_cuda and x.dim() == 2 and x.shape[0] >= min(TALL_ROWS, TALL_GEMM_ROWS)


def tall_gemm(t: torch.Tensor, k: int, n: int, weight_grad: bool = False, prologue: bool = False) -> bool:
    """Whether t @ B for the tall float32 matrix t [., k] and a B [k, n] runs on
    mgg/kernels/tall_gemm.cu (t on CUDA, >= TALL_GEMM_ROWS rows, widths the kernel takes, not
    switched off: mgg.kernels.tall_gemm.supports, enabled); `weight_grad`: whether t^T x for an
    x [., k] and t [., n] does (supports_weight_grad: the same widths with a prologue or not);
    `prologue`: with the affine + ReLU map on the [., k] operand."""
    if not (t.is_cuda and t.dtype == torch.float32 and t.dim() == 2 and t.shape[0] >= TALL_GEMM_ROWS):
        return False
    from ..kernels import tall_gemm as tg

    ok = tg.supports_weight_grad(k, n) if weight_grad else tg.supports(k, n, prologue)
    return ok and tg.enabled()


def _mm_wt(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           relu: bool = False) -> torch.Tensor:
    """(relu)(x W^T (+ b)): x [N, F], weight [O, F] -> [N, O], on the tall-GEMM kernel when it
    takes the shapes (`tall_gemm`), else cuBLAS (the ReLU in cuBLASLt's epilogue where there is
    a bias)."""
    if weight.dtype == torch.float32 and tall_gemm(x, int(x.shape[1]), int(weight.shape[0])):
        from ..kernels.tall_gemm import xb

        return xb(x, weight.detach().t(), bias, relu)
    if not relu:
        return x @ weight.t() if bias is None else torch.nn.functional.linear(x, weight, bias)
    if bias is None:
        return torch.relu(x @ weight.t())
    return torch._addmm_activation(bias, x, weight.t())


def _linear_grads(ctx, g: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, gw: torch.Tensor | None = None):
    """(grad x = G W, grad W = G^T x) of y = x W^T, each None where autograd does not need it
    (ctx.needs_input_grad[0], [1]): the G^T x form of the weight gradient (see above). `gw`:
    the weight gradient, already computed."""
    gx = None
    if ctx.needs_input_grad[0]:
        if weight.dtype == torch.float32 and tall_gemm(g, int(g.shape[1]), int(weight.shape[1])):
            from ..kernels.tall_gemm import xb

            gx = xb(g, weight.detach())
        else:
            gx = g @ weight
    if ctx.needs_input_grad[1] and gw is None:
        if x.dtype == torch.float32 and x.shape[0] == g.shape[0] and \
                tall_gemm(g, int(x.shape[1]), int(g.shape[1]), weight_grad=True):
            from ..kernels.tall_gemm import weight_grad

            gw = weight_grad(g, x).to(weight.dtype)
        else:
            gw = g.t() @ x
    return gx, gw


class _Project(torch.autograd.Function):
    """y = x W^T; backward: grad x = G W, grad W = G^T x."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        return _mm_wt(x, weight)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        return _linear_grads(ctx, g.contiguous(), x, weight)


def project(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight^T (x float [N, F], weight [O, F] -> [N, O]), with the G^T x weight gradient
    (and the tall-GEMM kernels where they take the widths) when x is a tall CUDA matrix
    (`_custom_backward`); plain autograd otherwise."""
    if _custom_backward(x) and torch.is_grad_enabled():
        return _Project.apply(x, weight)
    return _mm_wt(x, weight) if x.dim() == 2 else x @ weight.t()


class _DropoutProject(torch.autograd.Function):
    """y = dropout(x) W^T in one kernel, which also writes the keep bits (uint32 per 32 columns);
    backward: grad W = G^T dropout(x) in one kernel reading those bits, grad x = dropout(G W) (the
    same mask, from the seed)."""

    @staticmethod
    def forward(ctx, x, weight, p: float, seed, row0: int, row_scale=None):  # type: ignore[override]
        from ..kernels.dropout_project import project_forward

        x = x.detach()
        ctx.p, ctx.seed, ctx.row0, ctx.row_scale = p, seed, row0, row_scale
        # the keep bits (1/32 of x) spare the weight gradient the hash: 5.2 -> ~3 ms on papers-like@0.1
        keep = p > 0 and ctx.needs_input_grad[1]
        out, mask = project_forward(x, weight, p, seed, row0, keep_mask=True, row_scale=row_scale) if keep else \
            (project_forward(x, weight, p, seed, row0, row_scale=row_scale), None)
        ctx.save_for_backward(x, weight, mask)
        return out

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        from ..kernels.dropout_project import project_weight_grad

        x, weight, mask = ctx.saved_tensors
        g = g.contiguous()
        gx = gw = None
        if ctx.needs_input_grad[0]:
            gs = g if ctx.row_scale is None else g * ctx.row_scale.unsqueeze(1)
            gx = gs @ weight.to(g.dtype)
            if ctx.p > 0:
                from ..kernels.dropout_gpu import dropout_hash_cuda

                gx = dropout_hash_cuda(gx, ctx.p, ctx.seed, ctx.row0)
        if ctx.needs_input_grad[1]:
            gw = project_weight_grad(x, g, ctx.p, ctx.seed, ctx.row0, mask=mask,
                                     row_scale=ctx.row_scale).to(weight.dtype)
        return gx, gw, None, None, None, None


def fused_input_projection(x: torch.Tensor, out_features: int) -> bool:
    """Whether `dropout_project` runs fused kernels for x (a tall float32 CUDA matrix whose width
    and `out_features` the kernels take: mgg.kernels.dropout_project.supports)."""
    if not (x.is_cuda and x.dim() == 2 and x.shape[0] >= TALL_ROWS):
        return False
    from ..kernels.dropout_project import supports

    return supports(x, out_features)


def dropout_project(x: torch.Tensor, weight: torch.Tensor, p: float, seed: int | torch.Tensor,
                    row0: int, row_scale: torch.Tensor | None = None) -> torch.Tensor:
    """dropout(x) @ weight^T for x float32 CUDA [n, F] (when `fused_input_projection`), where
    dropout keeps entry (row0 + r, c) when hash_uniform(row0 + r, c, seed) >= p and scales by
    1 / (1 - p) -- global_dropout's mask for that seed; p = 0: x @ weight^T. Returns [n, O].
    row_scale: None or float32 [n] on x's GPU: output row r times row_scale[r], in the kernel
    (a factor folded in for the op reading the output, e.g. the gcn column factor)."""
    return _DropoutProject.apply(x, weight, float(p), seed if isinstance(seed, torch.Tensor) else int(seed),
                                 int(row0), row_scale)


def _relu_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """relu(x W^T + b): the ReLU in the GEMM's epilogue (the tall-GEMM kernel's, or cuBLASLt's
    where there is a bias)."""
    return _mm_wt(x, weight, bias, relu=True)


class _Linear(torch.autograd.Function):
    """y = x W^T + b on `_mm_wt`; backward: grad x = G W, grad W = G^T x (the tall-GEMM kernels
    where they take the shapes), grad b = sum of G. `stats` (None, or [shift, out list]): the
    tall-GEMM kernel also sums y's columns, and (mean, var) float64 [O] is appended to the list
    (no gradient: a batch norm reading y has its own backward through them)."""

    @staticmethod
    def forward(ctx, x, weight, bias, stats=None):  # type: ignore[override]
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight)
        if stats is not None:
            from ..kernels.tall_gemm import xb

            y, mean, var = xb(x, weight.detach().t(), bias, False, stats_shift=stats[0])
            stats[1].append((mean, var))
            return y
        return _mm_wt(x, weight, bias)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        g = g.contiguous()
        gb = g.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return (*_linear_grads(ctx, g, x, weight), gb, None)


def linear_with_stats(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      shift: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """(linear(x, weight, bias), this rank's column mean and biased variance of it, float64 [O]
    each) when the tall-GEMM kernel runs the product (`tall_gemm`, x non-empty, weight float32):
    its epilogue sums the columns, so a batch norm reading the output need not read it for its
    statistics (`shift` float32 [O], e.g. the norm's running mean: sums of (y - shift) keep
    the variance from cancelling). Elsewhere (linear(...), None)."""
    if not (weight.dtype == torch.float32 and x.dim() == 2 and x.shape[0] > 0
            and tall_gemm(x, int(x.shape[1]), int(weight.shape[0]))):
        return linear(x, weight, bias), None
    out: list = []
    y = _Linear.apply(x, weight, bias, [shift, out])
    return y, out[0]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for x float [N, F], weight [O, F], bias [O] or None -> [N, O]:
    on the tall-GEMM kernel with the G^T x weight gradient when x is a tall CUDA matrix
    (`tall_gemm`), F.linear otherwise. Values as F.linear's up to float32 summation order."""
    if not _custom_backward(x):
        return torch.nn.functional.linear(x, weight, bias)
    if not torch.is_grad_enabled() or not (x.requires_grad or weight.requires_grad
                                           or (bias is not None and bias.requires_grad)):
        return _mm_wt(x, weight, bias)
    return _Linear.apply(x, weight, bias)


class _LinearReLU(torch.autograd.Function):
    """y = relu(x W^T + b), the ReLU in the GEMM's epilogue; backward: G' = G where y > 0 (else
    0), grad x = G' W, grad W = G'^T x, grad b = sum of G' over rows."""

    @staticmethod
    def forward(ctx, x, weight, bias):  # type: ignore[override]
        y = _relu_linear(x, weight, bias)
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight, y)
        return y

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        x, weight, y = ctx.saved_tensors
        g, gw, gb = relu_backward(g.contiguous(), y, x, ctx.needs_input_grad[1],
                                  ctx.has_bias and ctx.needs_input_grad[2])
        return (*_linear_grads(ctx, g, x, weight, None if gw is None else gw.to(weight.dtype)), gb)


def relu_backward(g: torch.Tensor, y: torch.Tensor, x: torch.Tensor, need_w: bool, need_b: bool,
                  prologue: tuple[torch.Tensor, torch.Tensor] | None = None):
    """The ReLU's part of the backward of y = relu(z W^T + b), given g = dL/dy float [n, O] and
    the Linear's input x [n, K] (z = x, or z = relu(s x + o) with `prologue` (s, o)):
    (g' = g where y > 0 else 0, grad W = g'^T z or None, grad b = sum of g' over rows or None).
    Where the tall-GEMM kernels take the widths (and need_w), the mask, the bias sums and the
    weight gradient run in one kernel (mgg.kernels.tall_gemm.relu_weight_grad); else the mask and
    the bias gradient run in one pass (mgg/kernels/relu_grad.cu, or torch) and grad W is None:
    the caller computes it from g' (without a prologue: _linear_grads)."""
    if need_w and x.dtype == torch.float32 and x.shape[0] == g.shape[0] and \
            tall_gemm(g, int(x.shape[1]), int(g.shape[1]), weight_grad=True):
        from ..kernels.tall_gemm import relu_weight_grad

        gw, g, gb = relu_weight_grad(g, y, x, prologue)
        return g, gw, (gb if need_b else None)
    gb = None
    if need_b and g.is_cuda and g.dtype == torch.float32:
        from ..kernels.relu_grad import relu_backward_colsum, supports

        if supports(g):  # the mask and the bias gradient in one pass (mgg/kernels/relu_grad.cu)
            g, gb = relu_backward_colsum(g, y)
    if gb is None:
        g = torch.ops.aten.threshold_backward(g, y, 0.0)  # relu's own backward
        gb = g.sum(0) if need_b else None
    return g, None, gb


def linear_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """relu(x @ weight^T + bias): x float [N, F], weight [O, F], bias [O] or None -> [N, O], the
    same values as torch.relu(F.linear(x, weight, bias)) (the ReLU applied to the same sums), in
    one GEMM with a ReLU epilogue where there is a bias. Gradients as autograd's, up to float
    summation order of the weight gradient."""
    if x.dim() != 2:
        raise ValueError(f"linear_relu: x must be 2-D [N, F], got shape {tuple(x.shape)}")
    if not torch.is_grad_enabled() or not (x.requires_grad or weight.requires_grad
                                           or (bias is not None and bias.requires_grad)):
        return _relu_linear(x, weight, bias)
    return _LinearReLU.apply(x, weight, bias)
