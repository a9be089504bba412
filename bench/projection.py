"""The input projection of papers-like@0.1 layer 1 (x [11.1M, 128] -> 16) on one GPU, CUDA-event
medians: autograd's backward vs the G^T x GEMM (mgg.nn.dense.project), and the fused dropout +
projection kernels (mgg/kernels/dropout_project.cu) vs the dropout kernel + GEMM.

    python bench/projection.py
"""
import statistics
import torch


N, F, O = 11_105_996, 128, 16
x = torch.randn(N, F, device="cuda")
g = torch.randn(N, O, device="cuda")


def t(fn, reps=15):
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out[3:])


plain = t(lambda: g.t() @ x)
xt = t(lambda: x.t() @ g)
w = torch.randn(O, F, device="cuda", requires_grad=True)
def autograd_bwd():
    (x @ w.t()).backward(g)
ag = t(autograd_bwd)
fwd = t(lambda: x @ w.t().detach())

print(f"x^T @ g {xt:.3f} ms; autograd x @ W^T backward {ag:.3f} ms; forward {fwd:.3f} ms")
ref = (g.double().t() @ x.double())
err = lambda a: float((a.double() - ref).abs().max() / ref.abs().max())
print(f"g^T x GEMM {plain:.3f} ms; read floor {N*(F+O)*4/4.8e9:.3f} ms")

from mgg.kernels.dropout_project import project_forward, project_weight_grad
from mgg.kernels.dropout_gpu import dropout_hash_cuda
w16 = torch.randn(O, F, device="cuda")
seed, p = 123456789, 0.5
ref_fwd = t(lambda: dropout_hash_cuda(x, p, seed, 0) @ w16.t())
fused_fwd = t(lambda: project_forward(x, w16, p, seed, 0))
plain_fwd = t(lambda: x @ w16.t())
fused_fwd0 = t(lambda: project_forward(x, w16, 0.0, 0, 0))
xd = dropout_hash_cuda(x, p, seed, 0)
ref_bwd = t(lambda: g.t() @ xd)
fused_bwd = t(lambda: project_weight_grad(x, g, p, seed, 0))
fused_bwd0 = t(lambda: project_weight_grad(x, g, 0.0, 0, 0))
fused_fwd_bits = t(lambda: project_forward(x, w16, p, seed, 0, keep_mask=True))
_, bits = project_forward(x, w16, p, seed, 0, keep_mask=True)
fused_bwd_bits = t(lambda: project_weight_grad(x, g, p, seed, 0, mask=bits))
e1 = float((project_forward(x, w16, p, seed, 0) - xd @ w16.t()).abs().max())
e2 = float((project_weight_grad(x, g, p, seed, 0) - g.t() @ xd).abs().max() / (g.t() @ xd).abs().max())
print(f"dropout+project fwd: torch (dropout kernel + GEMM) {ref_fwd:.3f} ms, fused {fused_fwd:.3f} ms | "
      f"no dropout: GEMM {plain_fwd:.3f}, fused {fused_fwd0:.3f} ms (max abs diff {e1:.1e})")
print(f"weight grad: G^T dropout(x) GEMM on the stored dropout(x) {ref_bwd:.3f} ms, fused {fused_bwd:.3f} ms, "
      f"no dropout fused {fused_bwd0:.3f} ms (rel diff {e2:.1e})")
print(f"training pair (what the model runs): fused forward writing the keep bits {fused_fwd_bits:.3f} ms + "
      f"weight grad from the bits {fused_bwd_bits:.3f} ms = {fused_fwd_bits + fused_bwd_bits:.3f} ms | "
      f"no dropout: GEMM {plain_fwd:.3f} + G^T x GEMM {plain:.3f} = {plain_fwd + plain:.3f} ms | "
      f"dropout kernel + GEMMs {ref_fwd:.3f} + {ref_bwd:.3f} = {ref_fwd + ref_bwd:.3f} ms")
