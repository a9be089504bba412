"""The sampled training step replayed from a CUDA graph over batches padded to fixed capacities.

A sampled batch changes shape every step (its nodes and edges per layer, and the seeds of the
last step), so the eager step launches its ~150 kernels and runs autograd's bookkeeping on the
host every time, beside the loader's sampling thread and competing with it for the GIL. `PaddedStep`
records the step once over static buffers and replays it:

* the first `warmup` steps run eagerly and record the largest size of every level (the input
  nodes, each block's dst nodes, each block's edges, the seeds); the capacities are those times
  HEADROOM, plus one row (a level's last row is a padding row: the sink of padded edges);
* each later batch is copied into the buffers. Its features are not copied: when the batch gives
  them as mgg.nn.IndexedRows of one feature table, their ids are (the graph reads the table
  through them); when it gives gathered rows on the GPU and the first convolution reads indexed
  rows, the rows' address is (an int64 in device memory the kernels read) with the identity ids;
  otherwise the rows are copied. Padding ids are 0, a valid row. Each block's
  `ptr` with its padded dst rows empty, its `col` with padded edges on the sink row (inside no
  dst row's range: the sums never read them, and a degree count gives them to the sink alone);
  the graph degrees of the input nodes (`Block.src_degree`, GCN's normalisation: each block's src
  nodes are a prefix of them); the labels, and a loss weight of 1 for each seed and 0 for each
  padding row. Then the graph
  replays forward, backward, the gradient all-reduce (its count is the weights' sum, on the
  device) and the capturable Adam step. Padding rows hold finite values (zeros, or an earlier
  batch's) and reach no real row, and their loss weight is 0, so the update is the eager one;
* a batch above a capacity runs eagerly (it is rare: the capacities have headroom).

The capture runs a forward and backward on a side stream first (in eval mode: no dropout seed is
drawn, so the seeds follow the eager sequence; no optimizer step; the gradients are zeroed
after), so nothing lazy is left for it. If the capture fails on any rank every rank
goes on eagerly (the ranks agree by one host all-reduce), with the reason in `why_eager`.
Dropout draws its seeds from a counter on the GPU (mgg.nn.functional.DeviceSeeds) and the
block convolutions must aggregate with mgg.nn.block_sum (`takes_block_dropout`): both hold for
SAGE and GCN; GAT's block convolution uses index_add over its edges and runs eagerly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["PaddedStep", "HEADROOM", "can_pad", "eager_step", "padded_step"]

#: capacity over the largest size seen in the warm-up steps
HEADROOM = 1.2


def can_pad(model) -> bool:
    """Whether `model`'s step can be replayed over padded blocks: every conv aggregates with
    block_sum (padded edges on a sink row that no dst row's range holds)."""
    return all(getattr(conv, "takes_block_dropout", False) for conv in model.convs)


def eager_step(model, opt, comm, store, generator, batch) -> torch.Tensor:
    """One optimizer step on `batch` (a SampledBatch); returns this rank's part of the step's
    global-batch mean loss (the ranks' parts are summed later), a 0-d tensor."""
    from ..nn import allreduce_mean_gradients, cross_entropy_sum

    opt.zero_grad(set_to_none=False)
    local = cross_entropy_sum(model(batch.x, batch.blocks, generator), batch.y)
    local.backward()
    total = allreduce_mean_gradients(model, comm, batch.batch_size, store)
    opt.step()
    return local.detach() / (max(total, 1.0) if isinstance(total, float) else total.clamp(min=1.0))


def padded_step(model, opt, comm, store, generator, x, blocks, y, w) -> torch.Tensor:
    """`eager_step` over padded inputs: loss weights w (float32 [N_L]), the seed count w.sum() on
    the device; nothing reads the host, so it can be captured."""
    from ..nn import allreduce_mean_gradients, cross_entropy_sum

    opt.zero_grad(set_to_none=False)
    local = cross_entropy_sum(model(x, blocks, generator), y, w)
    local.backward()
    total = allreduce_mean_gradients(model, comm, w.sum(), store)
    opt.step()
    return local.detach() / total.clamp(min=1.0)


@dataclass
class _Buffers:
    """The static inputs of the captured step (every tensor on the GPU)."""

    x: object              # float32 [N0, F] input rows, or IndexedRows(table, int64 [N0] ids[, address])
    ptrs: list             # int64 [N_{l+1} + 1] per block
    cols: list             # int64 [E_l] per block
    y: torch.Tensor        # int64 [N_L] labels (0 on padding rows)
    w: torch.Tensor        # float32 [N_L] loss weights (1 seeds, 0 padding)
    degree: torch.Tensor   # int64 [N0] the graph's in-degree of the input rows (0 on padding rows)
    blocks: list           # mgg.sample.Block views of ptrs / cols / degree
    kind: str = "rows"     # how x takes a batch: "rows" (copied), "ids" (IndexedRows), "address"
    identity: torch.Tensor | None = None  # int64 [N0] 0 .. N0 - 1 ("address")


class PaddedStep:
    """`step(batch)` -> this rank's part of the step's mean loss (0-d tensor), replayed from a CUDA
    graph after `warmup` eager steps (module doc).

    Args:
        model: a SampledGNN whose convs pass `can_pad` (its optimizer a capturable mgg Adam).
        eager: the eager step, `eager(batch)` -> the same 0-d loss tensor.
        padded: `padded(x, blocks, y, w)` -> the loss of padded inputs (captured once).
        comm: the communicator (the capture outcome is agreed over it).
        warmup: eager steps before the capture (>= 1).
    Attributes:
        captured, why_eager, replays, eager_steps: what ran.
    """

    def __init__(self, model, eager: Callable, padded: Callable, comm, warmup: int = 4):
        if warmup < 1:
            raise ValueError(f"PaddedStep: warmup must be >= 1, got {warmup}")
        self.model, self.eager, self.padded, self.comm, self.warmup = model, eager, padded, comm, warmup
        self.graph = None
        self.bufs: _Buffers | None = None
        self.loss = None
        self.captured = False
        self.why_eager = ""
        self.replays = self.eager_steps = 0
        self._seen: list[int] | None = None   # largest sizes: nodes per level, then edges per block
        self._caps: list[int] | None = None

    # -- sizes ---------------------------------------------------------------------------------
    @staticmethod
    def _sizes(batch) -> list[int]:
        """[N_0 .. N_L, E_0 .. E_{L-1}] of a batch (host ints the loader already knows)."""
        blocks = batch.blocks
        return [int(blocks[0].n_src)] + [int(b.n_dst) for b in blocks] + [int(b.col.numel()) for b in blocks]

    def _fits(self, sizes: list[int]) -> bool:
        levels = len(self._caps) // 2 + 1
        # a level's last row is the sink: a real level must stay below it; edges may fill theirs
        return all(s < c for s, c in zip(sizes[:levels], self._caps[:levels])) and \
            all(s <= c for s, c in zip(sizes[levels:], self._caps[levels:]))

    # -- the step ------------------------------------------------------------------------------
    def _same_input(self, batch) -> bool:
        """Whether the batch's features take the buffers' form (rows, or ids into the same table)."""
        from ..nn.indexed_rows import IndexedRows

        if self.bufs is None:
            return True
        kind, mine, x = self.bufs.kind, self.bufs.x, batch.x
        if kind == "ids":
            return (isinstance(x, IndexedRows) and x.address is None and x.table.data_ptr() == mine.table.data_ptr()
                    and x.table.shape == mine.table.shape)
        if isinstance(x, IndexedRows):
            return False
        return kind == "rows" or _addressable(x, int(mine.shape[1]))

    def __call__(self, batch):
        sizes = self._sizes(batch)
        if self.captured and self._fits(sizes) and self._same_input(batch):
            return self._replay(batch)
        if self.why_eager or self.captured or self.eager_steps < self.warmup:
            self._seen = sizes if self._seen is None else [max(a, b) for a, b in zip(self._seen, sizes)]
            self.eager_steps += 1
            return self.eager(batch)
        self._capture(batch)
        if self.captured and self._fits(sizes) and self._same_input(batch):
            return self._replay(batch)
        self.eager_steps += 1
        return self.eager(batch)

    def _replay(self, batch):
        self._load(batch)
        self.graph.replay()
        self.replays += 1
        return self.loss

    def _allocate(self, batch) -> _Buffers:
        from ..nn.indexed_rows import IndexedRows
        from ..sample.block import Block

        levels = len(batch.blocks) + 1
        seen = [max(a, b) for a, b in zip(self._seen, self._sizes(batch))]
        self._caps = [int(math.ceil(s * HEADROOM)) + 1 for s in seen]
        dev, dim = batch.x.device, int(batch.x.shape[1])
        nodes, edges = self._caps[:levels], self._caps[levels:]
        kind, identity = "rows", None
        if isinstance(batch.x, IndexedRows):  # padding ids 0: a valid row, read by no real row
            kind, x = "ids", IndexedRows(batch.x.table, torch.zeros(nodes[0], dtype=torch.int64, device=dev))
        elif getattr(self.model.convs[0], "takes_indexed_rows", False) and _addressable(batch.x, dim):
            kind, identity = "address", torch.arange(nodes[0], device=dev)
            x = IndexedRows(torch.empty((0, dim), dtype=torch.float32, device=dev),
                            torch.zeros(nodes[0], dtype=torch.int64, device=dev),
                            torch.zeros(1, dtype=torch.int64, device=dev))
        else:
            x = torch.zeros((nodes[0], dim), dtype=batch.x.dtype, device=dev)
        ptrs = [torch.zeros(nodes[i + 1] + 1, dtype=torch.int64, device=dev) for i in range(levels - 1)]
        cols = [torch.full((edges[i],), nodes[i] - 1, dtype=torch.int64, device=dev) for i in range(levels - 1)]
        y = torch.zeros(nodes[-1], dtype=torch.int64, device=dev)
        w = torch.zeros(nodes[-1], dtype=torch.float32, device=dev)
        degree = torch.zeros(nodes[0], dtype=torch.int64, device=dev)
        blocks = [Block(ptrs[i], cols[i], nodes[i], nodes[i + 1], src_degree=degree[: nodes[i]])
                  for i in range(levels - 1)]
        return _Buffers(x, ptrs, cols, y, w, degree, blocks, kind, identity)

    def _load(self, batch) -> None:
        """Copy `batch` into the buffers (a handful of copies and fills on the current stream)."""
        b = self.bufs
        u = int(batch.x.shape[0])
        if b.kind == "address":  # the rows stay where the loader left them (alive for this stream)
            b.x.address.fill_(batch.x.data_ptr())
            b.x.index[:u].copy_(b.identity[:u])
            b.x.index[u:].zero_()
        elif b.kind == "ids":
            b.x.index[:u].copy_(batch.x.index)
        else:
            b.x[:u].copy_(batch.x)
        if batch.blocks[0].src_degree is not None:
            b.degree[:u].copy_(batch.blocks[0].src_degree)
        for i, blk in enumerate(batch.blocks):
            n_dst, e = int(blk.n_dst), int(blk.col.numel())
            b.ptrs[i][: n_dst + 1].copy_(blk.ptr)
            b.ptrs[i][n_dst + 1:].fill_(e)
            b.cols[i][:e].copy_(blk.col)
            b.cols[i][e:].fill_(b.blocks[i].n_src - 1)
        k = int(batch.y.numel())
        b.y[:k].copy_(batch.y)
        b.y[k:].zero_()
        b.w[:k].fill_(1.0)
        b.w[k:].zero_()

    def _capture(self, batch) -> None:
        why = ""
        try:
            self.bufs = self._allocate(batch)
            self._load(batch)
            side = torch.cuda.Stream(device=batch.x.device)
            side.wait_stream(torch.cuda.current_stream(batch.x.device))
            with torch.cuda.stream(side):  # warm-up: forward and backward without dropout, no update
                self.model.eval()
                try:
                    self.model(self.bufs.x, self.bufs.blocks, None).sum().backward()
                finally:
                    self.model.train()
                for p in self.model.parameters():
                    if p.grad is not None:
                        p.grad.zero_()
            torch.cuda.current_stream(batch.x.device).wait_stream(side)
            torch.cuda.synchronize(batch.x.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                loss = self.padded(self.bufs.x, self.bufs.blocks, self.bufs.y, self.bufs.w)
        except Exception as e:  # noqa: BLE001 - the reason is reported, the run goes on eagerly
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        failed = self.comm.allreduce_scalar(1.0 if why else 0.0, "max") > 0
        if failed:
            torch.cuda.synchronize()
            self.why_eager = why or "another rank could not capture the step"
            self.graph = self.bufs = None
            return
        self.graph, self.loss, self.captured = graph, loss, True


def _addressable(x, dim: int) -> bool:
    """Whether rows x can be read by their address: float32 [U, dim], contiguous, on a GPU, 16-byte aligned."""
    return (isinstance(x, torch.Tensor) and x.is_cuda and x.dtype == torch.float32 and x.dim() == 2
            and int(x.shape[1]) == dim and x.is_contiguous() and x.data_ptr() % 16 == 0)
