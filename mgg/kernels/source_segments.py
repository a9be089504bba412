"""A CSR cut by source row into S contiguous source ranges (segments), for aggregations whose
table is several times the GPU's L2.

`mgg_csr_rows` (mgg/kernels/local_csr.cu) sums each output row over its entries. On a table much
larger than the L2 (products-like at D = 16: 2.45M rows of 64 B, 157 MB against an H200's 60 MB)
most gathered rows miss it. Cut by source, pass k reads only the rows of segment k, a table a
S-th the size: the first pass writes every output row (with the self term), each later pass
adds to it (the kernels' `add`). Each extra pass costs a read and a write of the output, so it
pays only where the table is around one to four times the L2 and the rows are long enough
(`auto_source_segments`).

Measured on one H200 (torch reports 60 MB of L2), bench/results/2026-11-26-h200x1-1eb0ad7: c2
(kind sum, one launch per segment) and c3 (`bench/local_csr.py`, whole calls):

| ms | table / L2 | S = 1 | S = 2 | S = 3 |
| --- | --- | --- | --- | --- |
| products-like D = 16 sum (c2 / c3) | 2.5 | 1.718 / 1.596 | **1.449 / 1.422** | 1.507 / 1.490 |
| products-like D = 16 gcn (c3) | 2.5 | 1.760 | **1.604** | 1.726 |
| products-like D = 64 sum (c3) | 10 | **3.701** | 4.198 | 4.921 |
| reddit-like D = 64 gcn / sum (c3) | 1.0 | 2.969 / 3.008 | **2.888 / 2.931** | 2.913 / 2.962 |
| reddit-like D = 16 gcn / sum (c3) | 0.25 | **0.834 / 0.801** | 0.864 / 0.826 | 0.878 / 0.845 |

16-bit storage (one H200, bench/results/2026-11-27-h200x2-52bd5e5 c3:
whole calls on one GPU of two; the table as stored, 2 bytes an element):

| ms | table / L2 | S = 1 | S = 2 | S = 3 |
| --- | --- | --- | --- | --- |
| products-like D = 16 bf16 sum / gcn | 1.3 | 1.391 / 1.557 | **1.274 / 1.492** | 1.370 / 1.647 |
| products-like D = 16 fp16 sum / gcn | 1.3 | 1.271 / 1.674 | **1.181 / 1.602** | 1.305 / 1.736 |
| products-like D = 64 bf16 sum / gcn | 5.2 | **2.282 / 2.553** | 2.565 / 2.963 | 2.935 / 3.452 |
| products-like D = 64 fp16 sum / gcn | 5.2 | **2.288 / 2.775** | 2.690 / 3.264 | 3.145 / 3.774 |

so the rule is the same for every storage type, on the table's stored bytes.

More segments were slower everywhere (c2: products-like D = 16 at S = 4, 6, 8: 1.628, 1.813,
2.014 ms; D = 64 at S = 4 to 24: 5.9 to 13.7 ms).

Entries keep their order inside a row: a plan lists each row's sources ascending
(mgg.runtime.transpose.sort_within_rows), so a row's entries of segment k are one run of it and
a stable sort by segment keeps rows in order within each segment.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SourceSegment", "split_by_source", "source_segment_order", "auto_source_segments",
           "MAX_AUTO_SEGMENTS", "MAX_AUTO_SEGMENTS_SCAN",
           "AUTO_MIN_TABLE_L2", "AUTO_MAX_TABLE_L2", "MAX_AUTO_SEGMENTS_SCAN_16", "AUTO_MIN_TABLE_L2_SCAN_16",
           "AUTO_MIN_ENTRIES_PER_ROW"]

#: auto_source_segments cuts a table into two segments from this many times the L2's size ...
#: (reddit-like at D = 64, 1.0x: 1.03x faster in two; at D = 16, 0.25x: 3% slower)
AUTO_MIN_TABLE_L2 = 0.75
#: ... up to this many times. Products-like at D = 16 (2.5x an H200's L2) gained 1.10-1.19x, at
#: D = 64 (10x) lost 12%: beyond this, one.
AUTO_MAX_TABLE_L2 = 4.0
#: the most segments the automatic rule picks for the row kernels (more were slower everywhere
#: measured) ...
MAX_AUTO_SEGMENTS = 2
#: ... and for the scan mapping (mgg_csr_scan: a pass walks its rows for fewer instructions), where
#: three beat two on products-like (one H200, bench/results/2026-11-27-h200x1-52bd5e5 c4-c6, float32: D = 8 sum and gcn
#: 1.09-1.14x, D = 16 sum 1.03-1.10x, gcn within 2%)
MAX_AUTO_SEGMENTS_SCAN = 3
#: A self term (gcn, sum_self) takes the same count. Two won on a table
#: of 2 L2s or more while an adding pass loaded and stored its rows: products-like D = 16 gcn
#: ran two 1.02-1.05x faster than three (bench/results/2026-11-27-h200x1-a28b5e5 c2-c4). Since
#: the adding passes reduce into their rows (local_csr.cu's add_to_row), three won there: gcn on
#: a producer-scaled table 1.150 ms in three against 1.186 in two (-612ad9f c1).
#: ... and a scan call on a 16-bit table takes two from half the L2's size: its rows are half
#: float32's bytes for the same row walk a pass, so passes cost relatively more. One H200,
#: products-like (bench/results/2026-11-27-h200x2-97b2a66 c9; sum and gcn, bf16 and
#: fp16): D = 16 (78 MB, 1.3x the L2) two segments 1.02-1.05x faster than three and 1.17-1.22x
#: than one; D = 8 (39 MB, 0.65x) two 1.13-1.29x faster than one and 1.03-1.08x than three.
MAX_AUTO_SEGMENTS_SCAN_16 = 2
AUTO_MIN_TABLE_L2_SCAN_16 = 0.5
#: ... and only for CSRs of at least this many entries per row: every pass walks every row, so a
#: sparse CSR pays the passes' row costs for little gather. The row-subset plans of a GCN's last
#: layer (mgg.runtime.rowset; products-like: about 2 entries per row) made the products-like GCN
#: epoch 3.32 ms against 2.92 in one segment (c4), where the full plan (25 per row) gains.
AUTO_MIN_ENTRIES_PER_ROW = 16


@dataclass
class SourceSegment:
    """The entries of a CSR whose source row lies in [lo, hi).

    indptr: int64 [n + 1] over this segment's entries (every row of the CSR, empty ones too);
    src: int32 [E_k] source rows (still indices into the whole table); wt: float32 [E_k] the
    entries' weights, or None where the CSR had none. The entries' positions in the whole CSR
    are slice k of `source_segment_order` (not kept: 8 bytes an entry)."""

    lo: int
    hi: int
    indptr: torch.Tensor
    src: torch.Tensor
    wt: torch.Tensor | None

    @property
    def num_entries(self) -> int:
        return int(self.src.shape[0])


def _segment_rows(n_sources: int, segments: int) -> int:
    """Source rows a segment covers: ceil(n_sources / segments), at least 1."""
    return max(1, -(-int(n_sources) // segments))


def _segment_of(src: torch.Tensor, n_sources: int, segments: int) -> torch.Tensor:
    """int64 [E]: the segment of each entry's source (segments of _segment_rows rows)."""
    return torch.div(src.to(torch.int64), _segment_rows(n_sources, segments), rounding_mode="floor")


def source_segment_order(src: torch.Tensor, n_sources: int, segments: int) -> torch.Tensor:
    """int64 [E]: the positions of a CSR's entries (src: int [E], in row order) ordered by source
    segment, then by row, then as listed (the order S passes read them in). Torch ops on src's
    device."""
    if segments < 1:
        raise ValueError(f"source segments must be >= 1, got {segments}")
    pos = torch.arange(src.shape[0], dtype=torch.int64, device=src.device)
    if segments == 1:
        return pos
    return torch.argsort(_segment_of(src, n_sources, segments), stable=True)


def split_by_source(indptr: torch.Tensor, src: torch.Tensor, wt: torch.Tensor | None, n_sources: int,
                    segments: int) -> list[SourceSegment]:
    """Cut a CSR (int64 indptr [n + 1], int32 src [E] in [0, n_sources), optional float32 wt
    [E]) into `segments` CSRs by source range, each over all n rows. Torch ops on src's device;
    the pieces are new contiguous tensors (one more copy of src and wt, and `segments` row-pointer
    arrays). Segment k's entries are positions order[E_0 + ... + E_{k-1} :][:E_k] of the CSR,
    order = source_segment_order(src, n_sources, segments).

    One segment at a time: a mask of its entries (1 byte an entry), the running count of them
    (4 bytes an entry; 8 from 2^31 entries) read at the row starts for its row pointers, and the
    masked copy of src (and wt). The transient memory is about 5 bytes an entry plus the
    segment's own index (8 bytes an entry of it), where an argsort of all entries by segment took
    about 32 bytes an entry (products-like: 2 GB)."""
    if segments < 1:
        raise ValueError(f"source segments must be >= 1, got {segments}")
    dev = src.device
    size = _segment_rows(n_sources, segments)
    total = int(src.shape[0])
    if total and (int(src.min()) < 0 or int(src.max()) >= n_sources):
        raise ValueError(f"split_by_source: source rows must lie in [0, {n_sources}), got "
                         f"[{int(src.min())}, {int(src.max())}]")
    ip = indptr.to(device=dev, dtype=torch.int64)
    count_dtype = torch.int32 if total < 2**31 else torch.int64
    before = torch.zeros(total + 1, dtype=count_dtype, device=dev)  # before[p]: segment entries in [0, p)
    out = []
    for k in range(segments):
        lo, hi = k * size, min((k + 1) * size, int(n_sources))
        mine = (src >= lo) & (src < hi)
        torch.cumsum(mine, 0, dtype=count_dtype, out=before[1:])
        ptr = before[ip].to(torch.int64)
        out.append(SourceSegment(lo, hi, ptr, src[mine].to(torch.int32).contiguous(),
                                 None if wt is None else wt[mine].contiguous()))
        del mine
    return out


def auto_source_segments(table_bytes: int, l2_bytes: int, entries_per_row: float = float("inf"),
                         most: int = MAX_AUTO_SEGMENTS, min_l2: float | None = None) -> int:
    """Segments for a table of `table_bytes` (as stored: 16-bit rows count 2 bytes an element) on a
    GPU with `l2_bytes` of L2: `most` (MAX_AUTO_SEGMENTS for the row kernels,
    MAX_AUTO_SEGMENTS_SCAN for the scan mapping) where the table is `min_l2` (None:
    AUTO_MIN_TABLE_L2) to AUTO_MAX_TABLE_L2 times the L2 and the CSR has AUTO_MIN_ENTRIES_PER_ROW
    or more entries per row, else 1. Rows of more than one vector a lane (D > 128 float32) always
    run in one (CsrRowsExecutor.segments_for)."""
    if most < 1:
        raise ValueError(f"auto_source_segments: most must be >= 1, got {most}")
    if l2_bytes <= 0 or entries_per_row < AUTO_MIN_ENTRIES_PER_ROW:
        return 1
    ratio = table_bytes / l2_bytes
    lo = AUTO_MIN_TABLE_L2 if min_l2 is None else min_l2
    return most if lo <= ratio <= AUTO_MAX_TABLE_L2 else 1
