"""CPU executor of the fused attention / mean aggregation (GAT, SAGE-mean) over an AggregationPlan.

One rank aggregates into its targets [0, n) from an *edge set* built from its plan:

* local CSR entries, source = local id in [0, n);
* remote CSR entries, source = n + halo slot (the halo row fetched by `gather_halo`);
* with `add_self_loops`: the graph's own self loops are dropped and one self loop per target is
  added (PyG GATConv semantics: edges j -> i over N(i) plus {i}; duplicate edges count).

The "table" the edges read is `cat([local rows, halo rows])`, [n + H, ...].

Modes (per head h; z is the edge score, e the attention logit):

* ``additive`` (GAT, Velickovic et al.): z_ij = a_dst.Wh_i + a_src.Wh_j, e_ij = LeakyReLU(z_ij);
* ``dot``: e_ij = z_ij = (Wh_i . Wh_j) / sqrt(C) (MGG Table 2's "GAT with dot-product attention");
* ``mean``: no attention, out_i = (1 / deg_i) sum_j x_j (SAGE mean; deg counts duplicates).

Attention output: alpha_ij = exp(e_ij - m_i) / den_i with the per-target max m_i and sum den_i
(numerically stable softmax over the target's edges), out_i = sum_j alpha_ij keep_ij Wh_j, where
keep is the attention-dropout scale (1, or mask / (1 - p)).

Memory: the executor keeps only per-node state (out, m, den: [n, heads(, C)]) and, when attention
dropout is on, the [E, heads] keep mask; every per-edge tensor is built for one chunk of at most
`chunk_edges` edges, so no E x heads x C tensor exists at any time. The backward recomputes the
scores and alpha from the saved (m, den) instead of storing E x heads probabilities. With
c_i = g_i . out_i (per head), the softmax backward is dE_ij = alpha_ij (keep_ij g_i.Wh_j - c_i).

Two strategies run the same math (mgg.graph.adaptive picks one from the plan's degrees):

* ``edge`` (edge-centric, fuseGNN's GAS): COO chunks of edges in plan order, every reduction is a
  scatter (`scatter_reduce_` amax / `index_add_`) into per-target rows (the atomics of the GPU);
  the forward makes two passes (max, then exp-sum and weighted sum).
* ``node`` (node-centric, fuseGNN's GAR): edges sorted by target, chunks of whole targets,
  per-target reductions by `torch.segment_reduce` over CSR rows (a warp per target on the GPU),
  one pass per chunk. Source-side gradients (scatter to Wh_j) are index_adds in both.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..runtime.plan import AggregationPlan

__all__ = ["FusedEdges", "FusedCPUExecutor", "MODES", "STRATEGIES"]

MODES = ("additive", "dot", "mean")
STRATEGIES = ("node", "edge")
DEFAULT_CHUNK_EDGES = 1 << 16


class FusedEdges:
    """The edge set of one plan for the fused executors (see module docstring).

    Attributes (int64 tensors): `tgt`, `src` [E] in `strategy` order; `indptr` [n + 1] over that
    order for ``node`` (edges sorted by target); `deg` [n] edges per target; `chunks` a list of
    (edge_begin, edge_end, target_begin, target_end) (targets only meaningful for ``node``).
    """

    def __init__(self, plan: AggregationPlan, add_self_loops: bool, strategy: str,
                 chunk_edges: int = DEFAULT_CHUNK_EDGES):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        n = plan.n_local
        l_tgt = np.repeat(np.arange(n, dtype=np.int64), np.diff(plan.local_indptr))
        l_src = np.asarray(plan.local_indices, dtype=np.int64)
        if add_self_loops:
            keep = l_src != l_tgt
            l_tgt, l_src = l_tgt[keep], l_src[keep]
        r_tgt = np.repeat(np.arange(n, dtype=np.int64), np.diff(plan.remote_indptr))
        r_src = n + np.asarray(plan.remote_slot, dtype=np.int64)
        parts_t, parts_s = [l_tgt, r_tgt], [l_src, r_src]
        if add_self_loops:
            parts_t.append(np.arange(n, dtype=np.int64))
            parts_s.append(np.arange(n, dtype=np.int64))
        tgt, src = np.concatenate(parts_t), np.concatenate(parts_s)
        deg = np.bincount(tgt, minlength=n).astype(np.int64)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(deg, out=indptr[1:])
        if strategy == "node":
            order = np.argsort(tgt, kind="stable")
            tgt, src = tgt[order], src[order]
        self.strategy, self.n, self.num_edges = strategy, n, int(len(tgt))
        self.add_self_loops = add_self_loops
        self.tgt, self.src = torch.from_numpy(tgt), torch.from_numpy(src)
        self.deg, self.indptr = torch.from_numpy(deg), torch.from_numpy(indptr)
        chunk_edges = max(1, int(chunk_edges))
        self.chunks: list[tuple[int, int, int, int]] = []
        if strategy == "edge":
            for a in range(0, self.num_edges, chunk_edges):
                self.chunks.append((a, min(a + chunk_edges, self.num_edges), 0, n))
        else:  # whole targets, <= chunk_edges edges unless one target alone has more
            r0 = 0
            while r0 < n:
                r1 = int(np.searchsorted(indptr, indptr[r0] + chunk_edges, side="right")) - 1
                r1 = min(max(r1, r0 + 1), n)
                self.chunks.append((int(indptr[r0]), int(indptr[r1]), r0, r1))
                r0 = r1


class FusedCPUExecutor:
    """Fused attention (``additive`` / ``dot``) or ``mean`` aggregation of one plan on CPU.

    Tensors: `table_feat` [n + H, heads, C] (local rows then halo rows), `table_src` [n + H, heads]
    (additive only: a_src . Wh), `dst` [n, heads] (additive: a_dst . Wh) or [n, heads, C] (dot: Wh
    of the targets); mean uses heads = 1 and ignores `table_src` / `dst`.
    """

    def __init__(self, plan: AggregationPlan, mode: str = "additive", add_self_loops: bool = True,
                 strategy: str = "edge", negative_slope: float = 0.2,
                 chunk_edges: int = DEFAULT_CHUNK_EDGES):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.plan, self.mode = plan, mode
        self.negative_slope = float(negative_slope)
        self.edges = FusedEdges(plan, add_self_loops and mode != "mean", strategy, chunk_edges)
        self.strategy = strategy

    @property
    def num_edges(self) -> int:
        return self.edges.num_edges

    # -- per-chunk pieces ---------------------------------------------------------------------
    def _scores(self, tgt, src, table_feat, table_src, dst):
        """(z, e) [k, heads] of a chunk of edges."""
        if self.mode == "additive":
            z = dst.index_select(0, tgt) + table_src.index_select(0, src)
            return z, torch.nn.functional.leaky_relu(z, self.negative_slope)
        scale = 1.0 / math.sqrt(table_feat.shape[-1])
        z = (dst.index_select(0, tgt) * table_feat.index_select(0, src)).sum(-1) * scale
        return z, z

    def _reduce_tgt(self, vals, tgt, chunk, out, how="sum"):
        """out[t] (+)= reduction of vals over the chunk's edges grouped by target."""
        a, b, r0, r1 = chunk
        if self.strategy == "node":
            lengths = self.edges.deg[r0:r1]
            red = torch.segment_reduce(vals, "max" if how == "amax" else "sum", lengths=lengths, axis=0)
            if how == "amax":
                out[r0:r1] = torch.maximum(out[r0:r1], red)
            else:
                out[r0:r1] += red
        elif how == "amax":
            idx = tgt.view(-1, *([1] * (vals.dim() - 1))).expand_as(vals)
            out.scatter_reduce_(0, idx, vals, "amax", include_self=True)
        else:
            out.index_add_(0, tgt, vals)

    def _chunk(self, chunk):
        a, b = chunk[0], chunk[1]
        return self.edges.tgt[a:b], self.edges.src[a:b]

    # -- forward --------------------------------------------------------------------------------
    def forward(self, table_feat: torch.Tensor, table_src: torch.Tensor | None, dst: torch.Tensor | None,
                dropout: float = 0.0, generator: torch.Generator | None = None):
        """Returns (out [n, heads, C], m [n, heads], den [n, heads], keep [E, heads] or None).

        For ``mean``: out [n, 1, C], m = None, den = deg as float [n, 1].
        """
        n = self.edges.n
        heads, C = table_feat.shape[1], table_feat.shape[2]
        dt = table_feat.dtype
        out = torch.zeros((n, heads, C), dtype=dt)
        if self.mode == "mean":
            den = self.edges.deg.to(dt).unsqueeze(1)
            inv = torch.where(den > 0, 1.0 / den.clamp_min(1), torch.zeros_like(den))
            for ch in self.edges.chunks:
                tgt, src = self._chunk(ch)
                rows = table_feat.index_select(0, src) * inv.index_select(0, tgt).unsqueeze(-1)
                self._reduce_tgt(rows, tgt, ch, out)
            return out, None, den, None
        keep = None
        if dropout > 0.0:
            mask = torch.rand((self.num_edges, heads), generator=generator) >= dropout
            keep = mask.to(dt) / (1.0 - dropout)
        m = torch.full((n, heads), -math.inf, dtype=dt)
        den = torch.zeros((n, heads), dtype=dt)
        if self.strategy == "edge":  # pass 1: per-target max over all chunks
            for ch in self.edges.chunks:
                tgt, src = self._chunk(ch)
                _, e = self._scores(tgt, src, table_feat, table_src, dst)
                self._reduce_tgt(e, tgt, ch, m, "amax")
        for ch in self.edges.chunks:
            tgt, src = self._chunk(ch)
            _, e = self._scores(tgt, src, table_feat, table_src, dst)
            if self.strategy == "node":  # targets are whole inside the chunk: one pass
                self._reduce_tgt(e, tgt, ch, m, "amax")
            p = torch.exp(e - m.index_select(0, tgt))
            self._reduce_tgt(p, tgt, ch, den)
            if keep is not None:
                p = p * keep[ch[0]:ch[1]]
            self._reduce_tgt(p.unsqueeze(-1) * table_feat.index_select(0, src), tgt, ch, out)
        out /= torch.where(den > 0, den, torch.ones_like(den)).unsqueeze(-1)
        return out, m, den, keep

    # -- backward -------------------------------------------------------------------------------
    def backward(self, grad_out: torch.Tensor, out: torch.Tensor, m, den, keep,
                 table_feat: torch.Tensor, table_src: torch.Tensor | None, dst: torch.Tensor | None):
        """Gradients (grad_table_feat [n + H, heads, C], grad_table_src [n + H, heads] or None,
        grad_dst like `dst` or None) of <grad_out, out>, recomputing alpha from (m, den)."""
        g = grad_out.contiguous()
        grad_feat = torch.zeros_like(table_feat)
        if self.mode == "mean":
            inv = torch.where(den > 0, 1.0 / den.clamp_min(1), torch.zeros_like(den))
            for ch in self.edges.chunks:
                tgt, src = self._chunk(ch)
                grad_feat.index_add_(0, src, g.index_select(0, tgt) * inv.index_select(0, tgt).unsqueeze(-1))
            return grad_feat, None, None
        additive = self.mode == "additive"
        grad_src = torch.zeros_like(table_src) if additive else None
        grad_dst = torch.zeros_like(dst)
        c = (g * out).sum(-1)  # [n, heads]: sum_k alpha_ik keep_ik g_i . Wh_k
        safe_den = torch.where(den > 0, den, torch.ones_like(den))
        scale = 1.0 / math.sqrt(table_feat.shape[-1])
        for ch in self.edges.chunks:
            tgt, src = self._chunk(ch)
            z, e = self._scores(tgt, src, table_feat, table_src, dst)
            alpha = torch.exp(e - m.index_select(0, tgt)) / safe_den.index_select(0, tgt)
            beta = alpha if keep is None else alpha * keep[ch[0]:ch[1]]
            gt = g.index_select(0, tgt)                    # [k, heads, C]
            fs = table_feat.index_select(0, src)           # [k, heads, C]
            grad_feat.index_add_(0, src, beta.unsqueeze(-1) * gt)
            t = (gt * fs).sum(-1)
            if keep is not None:
                t = t * keep[ch[0]:ch[1]]
            dz = alpha * (t - c.index_select(0, tgt))
            if additive:
                dz = torch.where(z > 0, dz, dz * self.negative_slope)
                grad_src.index_add_(0, src, dz)
                self._reduce_tgt(dz, tgt, ch, grad_dst)
            else:
                dzs = (dz * scale).unsqueeze(-1)
                self._reduce_tgt(dzs * fs, tgt, ch, grad_dst)
                grad_feat.index_add_(0, src, dzs * dst.index_select(0, tgt))
        return grad_feat, grad_src, grad_dst
