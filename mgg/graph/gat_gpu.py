"""Launcher of mgg/kernels/gat_fused.cu: fused GAT / mean aggregation on the GPU. Tested in
tests/nn/test_gat_gpu.py.

Built by mgg.kernels.build (nvcc -rdc, device link against libnvshmem_device.a, cubin cached by
source hash + arch), loaded per GPU and registered with NVSHMEM before the first launch
(mgg.kernels.launch).

`GATGPUExecutor` has the interface of mgg.graph.adaptive.FusedAggregation's CPU branch:
forward(feat, src_score, dst, dropout, generator) -> (out, saved) and backward(...) -> local
gradients, both collective. Forward: publish [Wh | a_src.Wh] into dg.symmetric(W), then

* node-centric: gat_fwd_node reads remote rows straight from the peers (nvshmem get into shared
  memory, overlapped with the local neighbors), saves (m, l) per target and head;
* edge-centric: gat_gather_halo fetches each unique remote row once, gat_fwd_edge runs
  EPW-edge chunks with online softmax per target run, gat_merge_partials merges split targets;

release. Backward: c = (g * out).sum(-1) in torch, then gat_bwd_node (re-publishes the table: the
symmetric buffer may have been reused by other layers since the forward) or gat_bwd_edge (uses
the saved halo), source gradients of remote rows into a [H_halo, W] buffer summed at the owners by
mgg.graph.halo.scatter_halo_add.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..runtime.layout import padded_dim
from ..runtime.plan import AggregationPlan
from ..kernels.launch import blocks_for, kernel, launch

__all__ = ["build", "GATGPUExecutor", "KMAX_COLUMNS", "MAX_HEADS", "EDGES_PER_WARP"]

KMAX_COLUMNS = 256      # H * C <= 32 lanes * MGG_KMAX
MAX_HEADS = 16          # MGG_MAXH
EDGES_PER_WARP = 32     # edge-centric chunk per warp (fixed; not swept)
THREADS = 128           # 4 warps per block
_MODES = {"additive": 0, "dot": 1, "mean": 2}


def build(arch: str | None = None) -> str:
    """Compile gat_fused.cu to a cubin (cached by mgg.kernels.build); returns its path."""
    from ..kernels.build import build_cubin

    return build_cubin("gat_fused", arch).path


def _cp(t: torch.Tensor | None):
    import cupy

    return np.uint64(0) if t is None else cupy.asarray(t)


def split_slots(t_ptr: np.ndarray, epw: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Targets whose edges straddle EPW-edge warp ranges, and the partial-state slots to merge.

    Returns (split_tgt [S], slot_ptr [S + 1], slot_ids) mirroring gat_fwd_edge: warp w writes a
    target's run to slot 2w when the run starts at the warp's first edge, else to 2w + 1.
    """
    p0, p1 = t_ptr[:-1], t_ptr[1:]
    nz = p1 > p0
    w0 = np.where(nz, p0 // epw, 0)
    w1 = np.where(nz, (p1 - 1) // epw, 0)
    split = np.flatnonzero(nz & (w1 > w0)).astype(np.int64)
    counts = (w1 - w0 + 1)[split]
    slot_ptr = np.zeros(len(split) + 1, dtype=np.int64)
    np.cumsum(counts, out=slot_ptr[1:])
    w = np.repeat(w0[split], counts) + (np.arange(int(slot_ptr[-1])) - np.repeat(slot_ptr[:-1], counts))
    start = np.maximum(np.repeat(p0[split], counts), w * epw)
    slot_ids = 2 * w + (start != w * epw)
    return split, slot_ptr, slot_ids.astype(np.int64)


class GATGPUExecutor:
    """Fused attention / mean aggregation of one plan with the CUDA kernels."""
    def __init__(self, dg, plan: AggregationPlan, mode: str, add_self_loops: bool, strategy: str,
                 negative_slope: float, edges_per_warp: int = EDGES_PER_WARP):
        from ..kernels.gat_cpu import FusedEdges

        self.dg, self.plan, self.mode, self.strategy = dg, plan, mode, strategy
        self.add_self_loops = bool(add_self_loops) and mode != "mean"
        self.slope, self.epw = float(negative_slope), int(edges_per_warp)
        dev = dg.device
        n = plan.n_local

        def t(a, dt=torch.int64):
            return torch.from_numpy(np.ascontiguousarray(a)).to(dev, dt)

        self.l_ptr, self.l_idx = t(plan.local_indptr), t(plan.local_indices)
        self.r_ptr, self.r_pe, self.r_row = t(plan.remote_indptr), t(plan.remote_pe, torch.int32), t(plan.remote_row)
        self.r_slot = t(plan.remote_slot)
        self.halo_pe, self.halo_row = t(plan.halo_pe(), torch.int32), t(plan.halo_row)
        deg = np.diff(plan.local_indptr) + np.diff(plan.remote_indptr)
        self.mean_w = t(np.where(deg > 0, 1.0 / np.maximum(deg, 1), 0.0), torch.float32)
        if strategy == "edge":
            e = FusedEdges(plan, self.add_self_loops, "node")  # target-sorted edge list
            self.E = e.num_edges
            self.e_tgt, self.e_src = e.tgt.to(dev), e.src.to(dev)
            self.e_id = torch.arange(self.E, dtype=torch.int64, device=dev)
            tp = e.indptr.numpy()
            self.t_ptr = t(tp)
            split, sp, sid = split_slots(tp, self.epw)
            self.split_tgt, self.slot_ptr, self.slot_ids = t(split), t(sp), t(sid)
            self.n_split = len(split)
            self.n_edge_warps = -(-self.E // self.epw)
        self.n = n

    # -- helpers ---------------------------------------------------------------------------------
    def _args(self, H: int, C: int, W: int, dropout: float, seed: int) -> tuple:
        return (np.int32(self.n), np.int32(H), np.int32(C), np.int32(W), np.int32(_MODES[self.mode]),
                np.int32(self.add_self_loops), np.int32(self.plan.ps), np.float32(self.slope),
                np.float32(1.0 / math.sqrt(C)), np.float32(dropout), np.uint64(seed))

    def _grid(self, n_warps: int) -> tuple[tuple[int], tuple[int]]:
        return (blocks_for(n_warps * 32, THREADS, self.dg.device, 16),), (THREADS,)

    def _launch(self, name: str, n_warps: int, args: tuple, smem: int = 0, exact: bool = False) -> None:
        grid, block = ((max(1, -(-n_warps * 32 // THREADS)),), (THREADS,)) if exact else self._grid(n_warps)
        launch(kernel("gat_fused", name, self.dg.device, nvshmem=True), self.dg.device, grid, block, args,
               shared_mem=smem)

    def _publish(self, table: torch.Tensor):
        sym = self.dg.symmetric(int(table.shape[1]), torch.float32)
        sym.write(table)
        torch.cuda.current_stream(self.dg.device).synchronize()
        sym.publish()
        return sym

    def _release(self, sym) -> None:
        torch.cuda.current_stream(self.dg.device).synchronize()  # kernels done reading peers
        sym.release()

    @staticmethod
    def _table(feat, src_score):
        """[n, W] float32 rows [Wh | a_src.Wh], W padded to a multiple of 4 floats: the row stride
        of the NVSHMEM symmetric array (16-byte rows), which the kernels use for every table."""
        n, HC = feat.shape[0], feat.shape[1] * feat.shape[2]
        w0 = HC + (0 if src_score is None else src_score.shape[1])
        t = torch.zeros((n, padded_dim(w0)), dtype=torch.float32, device=feat.device)
        t[:, :HC] = feat.reshape(n, HC)
        if src_score is not None:
            t[:, HC:w0] = src_score
        return t

    # -- forward / backward ----------------------------------------------------------------------
    def forward(self, feat, src_score, dst, dropout=0.0, generator=None):
        n, H, C = feat.shape
        if H * C > KMAX_COLUMNS or H > MAX_HEADS:
            raise ValueError(f"gat_fused: heads * C = {H * C} > {KMAX_COLUMNS} or heads {H} > {MAX_HEADS}")
        table = self._table(feat, src_score)
        W = int(table.shape[1])
        seed = int(torch.randint(0, 2 ** 62, (1,), generator=generator).item()) if dropout > 0 else 0
        dst_t = (dst if dst is not None else table).float().contiguous()
        out = torch.zeros((n, H * C), dtype=torch.float32, device=feat.device)
        m = torch.full((n, H), -math.inf, dtype=torch.float32, device=feat.device)
        l = torch.zeros((n, H), dtype=torch.float32, device=feat.device)
        args = self._args(H, C, W, dropout, seed)
        sym = self._publish(table)
        halo = None
        try:
            if self.strategy == "node":
                smem = (THREADS // 32) * self.plan.ps * W * 4
                self._launch("gat_fwd_node", n, args + (_cp(sym.local), _cp(dst_t), _cp(self.l_ptr), _cp(self.l_idx),
                                                        _cp(self.r_ptr), _cp(self.r_pe), _cp(self.r_row),
                                                        _cp(self.mean_w), _cp(out), _cp(m), _cp(l)), smem)
            else:
                hsz = self.plan.halo_size
                halo = torch.empty((hsz, W), dtype=torch.float32, device=feat.device)
                if hsz:
                    self._launch("gat_gather_halo", hsz, (_cp(sym.local), _cp(self.halo_pe), _cp(self.halo_row),
                                                          np.int64(hsz), np.int32(W), _cp(halo)))
        finally:
            self._release(sym)
        if self.strategy == "edge" and self.E:
            stride = 1 + 2 * H + H * C
            partial = torch.empty((2 * self.n_edge_warps, stride), dtype=torch.float32, device=feat.device)
            self._launch("gat_fwd_edge", self.n_edge_warps,
                         args + (_cp(table), _cp(halo), _cp(dst_t), _cp(self.e_tgt), _cp(self.e_src), _cp(self.e_id),
                                 _cp(self.t_ptr), np.int64(self.E), np.int32(self.epw), _cp(self.mean_w),
                                 _cp(out), _cp(m), _cp(l), _cp(partial)), exact=True)
            if self.n_split:
                self._launch("gat_merge_partials", self.n_split,
                             args + (_cp(self.split_tgt), _cp(self.slot_ptr), _cp(self.slot_ids), np.int64(self.n_split),
                                     _cp(partial), _cp(out), _cp(m), _cp(l)))
        return out.view(n, H, C).to(feat.dtype), (m, l, halo, seed, dropout)

    def backward(self, grad_out, out, saved, feat, src_score, dst):
        from .halo import scatter_halo_add

        m, l, halo, seed, dropout = saved
        n, H, C = feat.shape
        HC = H * C
        table = self._table(feat, src_score)
        W = int(table.shape[1])
        g = grad_out.reshape(n, HC).float().contiguous()
        c = (grad_out * out).sum(-1).float().contiguous() if out is not None else torch.zeros((n, H), device=feat.device)
        dst_t = (dst if dst is not None else table).float().contiguous()
        grad_local = torch.zeros((n, W), dtype=torch.float32, device=feat.device)
        grad_halo = torch.zeros((self.plan.halo_size, W), dtype=torch.float32, device=feat.device)
        grad_dst = torch.zeros((n, HC if self.mode == "dot" else H), dtype=torch.float32, device=feat.device)
        args = self._args(H, C, W, dropout, seed)
        if self.strategy == "node":
            sym = self._publish(table)
            try:
                smem = (THREADS // 32) * self.plan.ps * W * 4
                self._launch("gat_bwd_node", n, args + (_cp(sym.local), _cp(dst_t), _cp(self.l_ptr), _cp(self.l_idx),
                                                        _cp(self.r_ptr), _cp(self.r_pe), _cp(self.r_row), _cp(self.r_slot),
                                                        _cp(self.mean_w), _cp(g), _cp(c), _cp(m), _cp(l),
                                                        _cp(grad_local), _cp(grad_halo), _cp(grad_dst)), smem)
            finally:
                self._release(sym)
        elif self.E:
            self._launch("gat_bwd_edge", self.n_edge_warps,
                         args + (_cp(table), _cp(halo), _cp(dst_t), _cp(self.e_tgt), _cp(self.e_src), _cp(self.e_id),
                                 np.int64(self.E), np.int32(self.epw), _cp(self.mean_w), _cp(g), _cp(c), _cp(m), _cp(l),
                                 _cp(grad_local), _cp(grad_halo), _cp(grad_dst)), exact=True)
        grad_local += scatter_halo_add(self.dg, grad_halo)
        gf = grad_local[:, :HC].reshape(n, H, C).to(feat.dtype)
        gs = None if src_score is None else grad_local[:, HC:HC + H].to(feat.dtype)
        if self.mode == "mean":
            return gf, None, None
        gd = grad_dst.view(n, H, C) if self.mode == "dot" else grad_dst
        return gf, gs, gd.to(feat.dtype)
