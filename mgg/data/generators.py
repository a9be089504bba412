"""Seeded, vectorised synthetic graphs with learnable labels.

* :func:`sbm` -- undirected planted-partition graph, features = class centroid + noise.
* :func:`powerlaw` and the presets ``reddit-like``, ``products-like``, ``papers-like`` --
  directed graphs with log-normal (heavy-tailed) in-degrees matching a target edge count,
  community-structured sources (labels = communities) and noisy-centroid features.

Node-level randomness comes from ``np.random.default_rng`` seeded by ``seed`` (independent
streams for structure, features and masks). The power-law generators draw every edge and every
feature noise value from a counter-based hash of (seed, edge id / node and column)
(`mgg.data.hashrng`) with torch ops on ``device`` (CPU by default, or CUDA), so the output is a
pure function of the arguments and the same on every device.

Memory of the presets at ``scale=1``: indices 8 B/edge + indptr 8 B/node + x 4*F B/node,
plus ~100 B/edge of temporaries per chunk of edges (2**17 per thread on the CPU, 2**25 on CUDA): reddit-like ~1.5 GB,
products-like ~1.5 GB, papers-like ~13 GB (indices) + ~57 GB (x) -- do not run papers-like
at full size on a small machine; use ``scale``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .graph import Graph, csr_from_edges
from .hashrng import M32, approx_normal, below24, mix32, stream_keys, uniform53, words
from .validate import validate_graph

__all__ = ["sbm", "powerlaw", "preset", "save_preset", "PRESETS", "PowerLawPreset", "PowerLawParts", "powerlaw_parts", "preset_parts",
           "reddit_like", "products_like", "papers_like"]

_ROW_CHUNK = 1 << 16


def _streams(seed: int, k: int) -> list[np.random.Generator]:
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(k)]


def _centroid_features(y: np.ndarray, num_features: int, centroid_scale: float, noise: float,
                       rng: np.random.Generator, num_classes: int) -> np.ndarray:
    """float32 [N, F]: ``centroid_scale * c[y] + noise * eps`` with c, eps ~ N(0, 1)."""
    n = len(y)
    cent = (rng.standard_normal((num_classes, num_features), dtype=np.float32) * np.float32(centroid_scale))
    x = np.empty((n, num_features), dtype=np.float32)
    for s in range(0, n, _ROW_CHUNK):
        blk = x[s:s + _ROW_CHUNK]
        rng.standard_normal(out=blk, dtype=np.float32)
        blk *= np.float32(noise)
        blk += cent[y[s:s + _ROW_CHUNK]]
    return x


def _split_masks(n: int, fracs: tuple[float, float, float], rng: np.random.Generator):
    a, b, c = fracs
    if a < 0 or b < 0 or c < 0 or a + b + c > 1 + 1e-9:
        raise ValueError(f"split fractions must be >= 0 and sum to <= 1, got {fracs}")
    u = rng.random(n, dtype=np.float32)
    return u < a, (u >= a) & (u < a + b), (u >= a + b) & (u < a + b + c)


def _balanced_labels(n: int, num_classes: int, rng: np.random.Generator, skew: float = 0.0) -> np.ndarray:
    """int64 [n] labels; every class present when n >= C; class c has weight (c+1)^-skew."""
    if num_classes < 1:
        raise ValueError("num_classes must be >= 1")
    if skew == 0.0:
        y = np.arange(n, dtype=np.int64) % num_classes
    else:
        p = (np.arange(1, num_classes + 1, dtype=np.float64)) ** -skew
        p /= p.sum()
        k = min(n, num_classes)
        y = np.concatenate([np.arange(k, dtype=np.int64),
                            rng.choice(num_classes, size=n - k, p=p).astype(np.int64)])
    return rng.permutation(y)


# ---------------------------------------------------------------------------------- SBM
def sbm(num_nodes: int = 2000, num_classes: int = 7, avg_degree: float = 10.0,
        p_in_ratio: float = 10.0, num_features: int = 32, feature_noise: float | None = None,
        split: tuple[float, float, float] = (0.6, 0.2, 0.2), seed: int = 0,
        name: str | None = None) -> Graph:
    """Undirected planted-partition (stochastic block model) graph.

    Nodes get balanced labels ``y`` in ``[0, num_classes)``. About ``num_nodes*avg_degree/2``
    undirected pairs are drawn: one endpoint uniform, the other uniform inside its class with
    probability ``q = r / (r + C - 1)`` (``r = p_in_ratio = p_in / p_out``) else uniform in the
    other classes; self loops are dropped; both directions are stored (so E ~= N*avg_degree,
    symmetric CSR, rows sorted by insertion order). Features: float32 [N, F] =
    class centroid (N(0,1)) + ``feature_noise`` * N(0,1) (default ``0.6*sqrt(F)``: a
    nearest-centroid classifier gets ~55% from a node's own features at the defaults, ~90%
    after one mean-aggregation hop), so a GCN learns it well and the graph matters. Masks: random split with fractions
    ``split`` (train, val, test).
    """
    n, C = int(num_nodes), int(num_classes)
    if n < 1:
        raise ValueError("num_nodes must be >= 1")
    if p_in_ratio <= 0 or avg_degree < 0:
        raise ValueError("p_in_ratio must be > 0 and avg_degree >= 0")
    rs, rf, rm = _streams(seed, 3)
    y = _balanced_labels(n, C, rs)
    members = np.argsort(y, kind="stable")
    size = np.bincount(y, minlength=C)
    off = np.concatenate([[0], np.cumsum(size)[:-1]])
    m = int(round(n * avg_degree / 2))
    a = rs.integers(0, n, size=m)
    ca = y[a]
    q = p_in_ratio / (p_in_ratio + C - 1) if C > 1 else 1.0
    intra = rs.random(m) < q
    u = rs.random(m)
    other = n - size[ca]
    intra |= other == 0
    pos_in = off[ca] + np.minimum((u * size[ca]).astype(np.int64), size[ca] - 1)
    r = np.minimum((u * other).astype(np.int64), np.maximum(other - 1, 0))
    pos_out = np.where(r < off[ca], r, r + size[ca])
    b = members[np.where(intra, pos_in, pos_out)]
    keep = a != b
    a, b = a[keep], b[keep]
    indptr, indices = csr_from_edges(np.concatenate([a, b]), np.concatenate([b, a]), n)
    if feature_noise is None:
        feature_noise = 0.6 * float(np.sqrt(num_features))
    x = _centroid_features(y, num_features, 1.0, feature_noise, rf, C) if num_features > 0 else None
    tr, va, te = _split_masks(n, split, rm)
    g = Graph(indptr, indices, x=x, y=y, train_mask=tr, val_mask=va, test_mask=te,
              name=name or f"sbm-{n}")
    return validate_graph(g, "<generator sbm>")


# ----------------------------------------------------------------------------- power law
def _apportion(w: np.ndarray, total: int) -> np.ndarray:
    """int64 counts proportional to ``w`` summing exactly to ``total`` (largest remainder)."""
    f = w * (total / w.sum())
    d = np.floor(f).astype(np.int64)
    rem = int(total - d.sum())
    if rem > 0:
        frac = f - d
        idx = np.argpartition(-frac, rem - 1)[:rem] if rem < len(w) else np.arange(len(w))
        d[idx] += 1
    return d


def powerlaw(num_nodes: int, num_edges: int, num_features: int, num_classes: int, name: str = "powerlaw",
             **options: Any) -> Graph:
    """The graph of `powerlaw_parts` (same arguments; ``options`` are its keyword arguments:
    sigma, p_in, feature_noise, class_skew, source_alpha, split, seed, device), assembled in
    memory and validated. To write one larger than memory, see `save_preset`."""
    return _assemble(powerlaw_parts(num_nodes, num_edges, num_features, num_classes, **options), name)


def _assemble(parts: "PowerLawParts", name: str) -> Graph:
    """Draw every chunk of `parts` into in-memory arrays: the Graph."""
    dev = parts.device
    indices = torch.empty(parts.num_edges, dtype=torch.int64, device=dev)
    for e0, e1, src in parts.source_chunks():
        indices[e0:e1] = src
    x = None
    if parts.num_features > 0:
        x = torch.empty((parts.num_nodes, parts.num_features), dtype=torch.float32, device=dev)
        for r0, r1, rows in parts.feature_chunks():
            x[r0:r1] = rows
        x = x.cpu().numpy()
    g = Graph(parts.indptr, indices.cpu().numpy(), x=x, y=parts.y, train_mask=parts.train_mask,
              val_mask=parts.val_mask, test_mask=parts.test_mask, name=name)
    return validate_graph(g, f"<generator {name}>")


def powerlaw_parts(num_nodes: int, num_edges: int, num_features: int, num_classes: int,
                   sigma: float = 1.3, p_in: float = 0.8, feature_noise: float | None = None,
                   class_skew: float = 0.5, source_alpha: float = 0.5,
                   split: tuple[float, float, float] = (0.6, 0.2, 0.2), seed: int = 0,
                   device: str | torch.device | None = None) -> "PowerLawParts":
    """Directed heavy-tailed community graph with exactly ``num_edges`` edges.

    * Node weights ``w ~ LogNormal(0, sigma)``; in-degrees are ``num_edges`` apportioned in
      proportion to ``w`` (so the mean degree is exactly E/N and the tail is heavy).
    * Labels (= communities) drawn with class weights ``(c+1)^-class_skew``, every class
      present when N >= C; node ids are randomly permuted w.r.t. communities.
    * Each in-edge of a node in community c takes its source from c with probability ``p_in``
      (else from the whole graph), proportionally to ``w ** source_alpha`` (popular nodes are
      cited more; ``source_alpha < 1`` keeps out-degrees and duplicate edges moderate), via
      inverse-CDF search of a 53-bit uniform on community-sorted cumulative weights.
      Self loops are redrawn (3 times, then moved to a uniform other node); duplicates are
      possible (rare except around hubs).
    * CSR is emitted directly in row order (no sort), in chunks of rows.
    * x float32 [N, F] = community centroid (N(0,1)) + ``feature_noise`` * z, z an Irwin-Hall
      approximately-normal variate (default ``0.5*sqrt(F)``: own features alone are weakly
      informative, neighbourhood averaging recovers the label); masks: random ``split``.

    Randomness: node-level draws (labels, weights, centroids, masks) come from
    ``np.random.default_rng`` streams of ``seed``; every per-edge and per-feature draw is a
    counter-based hash of (seed, edge id / (node, column)) computed with torch ops on ``device``
    (None: CPU, with torch's intra-op threads; "cuda": the GPU, about 100x faster). The graph is a
    pure function of the arguments and the same bit for bit on every device.

    Returns the node-level arrays and the chunk iterators (PowerLawParts); `powerlaw` assembles
    them into a Graph, `save_preset` streams them into a file.
    """
    return _powerlaw_parts(num_nodes, num_edges, num_features, num_classes, sigma, p_in, feature_noise,
                           class_skew, source_alpha, split, seed, device)

@dataclass
class PowerLawParts:
    """A power-law graph before its per-edge and per-feature draws: the node-level arrays
    (int64 ``indptr`` [N+1], int64 ``y`` [N], bool masks [N]) and two chunk iterators that draw
    the rest in row order on ``device``. `powerlaw` assembles them in memory; a writer can stream
    them to disk instead (mgg.data.npzstream), holding only the node-level arrays and one chunk."""

    num_nodes: int
    num_edges: int
    num_features: int
    indptr: np.ndarray
    y: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    device: torch.device
    _sources: dict
    _features: dict

    def source_chunks(self):
        """Yield (e0, e1, int64 tensor [e1 - e0] on ``device``): the sources of CSR entries
        [e0, e1), in order, covering [0, E)."""
        return _powerlaw_sources(self.indptr, **self._sources)

    def feature_chunks(self):
        """Yield (r0, r1, float32 tensor [r1 - r0, F] on ``device``): feature rows in order."""
        return _hash_centroid_features(**self._features)


def _powerlaw_parts(num_nodes, num_edges, num_features, num_classes, sigma, p_in, feature_noise, class_skew,
                    source_alpha, split, seed, device) -> PowerLawParts:
    """Node-level draws of `powerlaw` (same arguments), in a PowerLawParts."""
    n, E, C = int(num_nodes), int(num_edges), int(num_classes)
    if n < 1 or E < 0:
        raise ValueError("num_nodes must be >= 1 and num_edges >= 0")
    if E >= 1 << 32:
        raise ValueError(f"num_edges must be < 2^32 (edge ids are 32-bit hash counters), got {E}")
    dev = torch.device("cpu") if device is None else torch.device(device)
    rs, rf, rm = _streams(seed, 3)
    y = _balanced_labels(n, C, rs, skew=class_skew)
    w = rs.lognormal(0.0, sigma, size=n)
    deg = _apportion(w, E)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(deg, out=indptr[1:])
    del deg
    members = np.argsort(y, kind="stable")
    cw = np.cumsum(w[members] ** source_alpha)  # source popularity, flatter than in-degree
    del w
    size = np.bincount(y, minlength=C)
    off = np.concatenate([[0], np.cumsum(size)])  # community c = members[off[c]:off[c+1]]
    cw0 = np.concatenate([[0.0], cw])  # cw0[k] = weight before members[k]
    sources = dict(y=y, members=members, cw=cw, start=cw0[off[:-1]], width=cw0[off[1:]] - cw0[off[:-1]],
                   total=float(cw[-1]), p_in=p_in, seed=seed, dev=dev)
    del cw0
    if feature_noise is None:
        feature_noise = 0.5 * float(np.sqrt(num_features))
    # the centroids are drawn now (from rf) so the masks below see the same stream state as before
    features = dict(y=y, cent=_centroids(num_features, 1.0, rf, C), noise=feature_noise, seed=seed, dev=dev)
    tr, va, te = _split_masks(n, split, rm)
    return PowerLawParts(n, E, int(num_features), indptr, y, tr, va, te, dev, sources, features)


def _chunk_edges(dev: torch.device) -> int:
    """Edges per chunk: 2^25 on CUDA; on the CPU 2^17 per intra-op thread (each op's share stays
    in cache, and few enough parallel regions that thread start-up does not dominate)."""
    return 1 << 25 if dev.type == "cuda" else (1 << 17) * max(2, torch.get_num_threads())


def _row_chunks(indptr: np.ndarray, chunk: int):
    """(row_begin, row_end) covering [0, n) with about `chunk` CSR entries each (>= 1 row)."""
    n = len(indptr) - 1
    row = 0
    while row < n:
        hi = int(np.searchsorted(indptr, indptr[row] + chunk, side="right")) - 1
        hi = min(max(hi, row + 1), n)
        yield row, hi
        row = hi


class _GuideSearch:
    """``torch.searchsorted(cdf, r, right=True)`` by a guide table (Chen & Asau): a query starts
    at the first index of its bucket of [0, cdf[-1]) and walks forward a step or two; the few
    queries a fixed number of steps does not settle (or that float rounding put past their
    answer) fall back to the exact search, so the result is exact (hence device independent)
    and costs O(1) expected loads per query instead of log2(len(cdf))."""

    STEPS = 3

    def __init__(self, cdf: np.ndarray, dev: torch.device):
        self.n = len(cdf)
        self.m = max(1024, 2 * self.n)
        self.scale = self.m / float(cdf[-1]) if self.n and cdf[-1] > 0 else 0.0
        edges = np.arange(self.m + 1, dtype=np.float64) / self.scale if self.scale else np.zeros(self.m + 1)
        self.cdf = torch.from_numpy(np.ascontiguousarray(cdf)).to(dev)
        self.guide = torch.from_numpy(np.searchsorted(cdf, edges, side="left")).to(dev)

    def __call__(self, r: torch.Tensor) -> torch.Tensor:
        n, cdf = self.n, self.cdf
        # start one bucket early: the start of bucket floor(r * scale) - 1 lies below r whatever
        # the rounding of r * scale and of the bucket edges (both relative errors ~1e-16), so
        # every index before the guide entry has cdf < r and the answer is at or after it
        pos = self.guide[((r * self.scale).to(torch.int64) - 1).clamp_(0, self.m - 1)]
        for _ in range(self.STEPS):
            pos += (cdf[pos.clamp(max=n - 1)] <= r) & (pos < n)
        bad = (pos < n) & (cdf[pos.clamp(max=n - 1)] <= r)  # not settled in STEPS steps
        idx = torch.nonzero(bad).reshape(-1)
        if idx.numel():
            pos[idx] = torch.searchsorted(cdf, r[idx], right=True)
        return pos


def _powerlaw_sources(indptr: np.ndarray, y: np.ndarray, members: np.ndarray, cw: np.ndarray,
                      start: np.ndarray, width: np.ndarray, total: float, p_in: float, seed: int,
                      dev: torch.device):
    """Yield (e0, e1, int64 tensor on `dev`): the sources of CSR entries [e0, e1) (row = target),
    drawn from hash words of the edge id: attempt a uses stream a (a = 0..3); self loops left
    after attempt 3 move to (target + 1 + word % (n - 1)) % n."""
    n, E = len(indptr) - 1, int(indptr[-1])
    if E == 0:
        return
    T = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dev)  # noqa: E731
    deg_t, y_t, members_t = T(np.diff(indptr)), T(y.astype(np.int64)), T(members)
    start_t, width_t = T(start), T(width)
    keys = [stream_keys(seed, 10 + a, 3) for a in range(5)]
    search = _GuideSearch(cw, dev)

    def draw(e: torch.Tensor, c: torch.Tensor, attempt: int) -> torch.Tensor:
        a, b, m = words(e, keys[attempt], 3)
        u = uniform53(a, b)
        r = torch.where(below24(m, p_in), start_t[c] + u * width_t[c], u * total)
        return members_t[search(r).clamp_(max=n - 1)]

    for row, hi in _row_chunks(indptr, _chunk_edges(dev)):
        e0, e1 = int(indptr[row]), int(indptr[hi])
        if e1 == e0:
            continue
        d = deg_t[row:hi]
        tgt = torch.repeat_interleave(torch.arange(row, hi, device=dev), d, output_size=e1 - e0)
        c = torch.repeat_interleave(y_t[row:hi], d, output_size=e1 - e0)
        e = torch.arange(e0, e1, device=dev)
        src = draw(e, c, 0)
        if n > 1:
            for attempt in range(1, 4):
                bad = torch.nonzero(src == tgt).reshape(-1)
                if bad.numel() == 0:
                    break
                src[bad] = draw(e[bad], c[bad], attempt)
            bad = torch.nonzero(src == tgt).reshape(-1)
            if bad.numel():
                (h,) = words(e[bad], keys[4], 1)
                src[bad] = (tgt[bad] + 1 + h % (n - 1)) % n
        yield e0, e1, src


def _centroids(num_features: int, centroid_scale: float, rng: np.random.Generator, num_classes: int) -> np.ndarray:
    """float32 [C, F] class centroids ~ N(0, 1) * centroid_scale, from `rng`."""
    return rng.standard_normal((num_classes, int(num_features)), dtype=np.float32) * np.float32(centroid_scale)


def _hash_centroid_features(y: np.ndarray, cent: np.ndarray, noise: float, seed: int, dev: torch.device):
    """Yield (r0, r1, float32 tensor [r1 - r0, F] on `dev`): rows ``cent[y] + noise * z``, z the
    approximately normal hash variate of (seed, node, column)."""
    n, F = len(y), cent.shape[1]
    if F == 0:
        return
    cent_t = torch.from_numpy(cent).to(dev)
    y_t = torch.from_numpy(y.astype(np.int64)).to(dev)
    keys = stream_keys(seed, 20, 3)
    col = (torch.arange(F, device=dev, dtype=torch.int64) * 0x9E3779B1) & M32
    rows = max(1, _chunk_edges(dev) // F)
    for s in range(0, n, rows):
        r = torch.arange(s, min(n, s + rows), device=dev)
        h_row = mix32(r ^ keys[0])
        a, b = words((h_row[:, None] ^ col[None, :]), keys[1:], 2)  # 2 more rounds per entry
        z = approx_normal(a, b)
        yield s, s + len(r), cent_t[y_t[s: s + rows]] + z * float(np.float32(noise))


@dataclass(frozen=True)
class PowerLawPreset:
    """Target sizes of a real dataset mimicked by :func:`powerlaw` (split = its real ratios)."""

    name: str
    num_nodes: int
    num_edges: int
    num_features: int
    num_classes: int
    split: tuple[float, float, float]
    p_in: float = 0.8


PRESETS: dict[str, PowerLawPreset] = {
    "reddit-like": PowerLawPreset("reddit-like", 232_965, 114_615_892, 602, 41, (0.66, 0.10, 0.24)),
    "products-like": PowerLawPreset("products-like", 2_449_029, 61_859_140, 100, 47, (0.08, 0.02, 0.90)),
    "papers-like": PowerLawPreset("papers-like", 111_059_956, 1_615_685_872, 128, 172, (0.011, 0.001, 0.002), 0.7),
}


def preset_sizes(name: str, scale: float = 1.0) -> tuple[int, int]:
    """(num_nodes, num_edges) of preset ``name`` at ``scale`` in (0, 1] (mean degree kept)."""
    p = PRESETS[name]
    if not (0 < scale <= 1):
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    return max(1, int(round(p.num_nodes * scale))), int(round(p.num_edges * scale))


def preset_parts(name: str, scale: float = 1.0, seed: int = 0, device=None) -> tuple[PowerLawParts, str]:
    """(PowerLawParts of preset `name` at `scale`, its display name): the graph before its per-edge
    and per-feature draws (see `save_preset` and `python -m mgg.prepare --dry-run`)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid: {sorted(PRESETS)}")
    p = PRESETS[name]
    n, e = preset_sizes(name, scale)
    parts = powerlaw_parts(n, e, p.num_features, p.num_classes, p_in=p.p_in, split=p.split, seed=seed, device=device)
    return parts, name if scale == 1 else f"{name}@{scale:g}"


def save_preset(name: str, path: str, scale: float = 1.0, seed: int = 0,
                device: str | torch.device | None = None, progress=None) -> tuple[int, int]:
    """Generate preset ``name`` straight into the CSR ``.npz`` at `path` (atomically), streaming
    the indices and features chunk by chunk: host memory holds the node-level arrays (about
    50 B/node) and one chunk, never the edges or the features (papers-like at scale 1 fits a
    small host; the file takes 8 B/edge + (4 F + 27) B/node). The file equals
    ``save_npz(preset(name, scale, seed), path)`` in content. Returns (num_nodes, num_edges)."""
    from .npzstream import StreamedMember, chunk_values, write_npz_stream

    parts, _ = preset_parts(name, scale, seed, device)
    members = {"indptr": parts.indptr,
               "indices": StreamedMember((parts.num_edges,), np.int64, chunk_values(parts.source_chunks())),
               "num_nodes": np.int64(parts.num_nodes)}
    if parts.num_features > 0:
        members["x"] = StreamedMember((parts.num_nodes, parts.num_features), np.float32,
                                      chunk_values(parts.feature_chunks()))
    members.update(y=parts.y, train_mask=parts.train_mask, val_mask=parts.val_mask, test_mask=parts.test_mask)
    write_npz_stream(path, members, progress)
    return parts.num_nodes, parts.num_edges


def preset(name: str, scale: float = 1.0, seed: int = 0, device: str | torch.device | None = None) -> Graph:
    """Generate preset ``name`` (a key of :data:`PRESETS`) shrunk by ``scale`` in (0, 1]:
    nodes and edges both multiplied by ``scale`` (average degree kept); F and C unchanged.
    ``device``: where the per-edge and per-feature draws run (None: CPU); same graph on any."""
    return _assemble(*preset_parts(name, scale, seed, device))


def reddit_like(scale: float = 1.0, seed: int = 0, device: str | torch.device | None = None) -> Graph:
    """232,965 nodes, 114,615,892 edges, 602 features, 41 classes at ``scale=1``."""
    return preset("reddit-like", scale, seed, device)


def products_like(scale: float = 1.0, seed: int = 0, device: str | torch.device | None = None) -> Graph:
    """2,449,029 nodes, 61,859,140 edges, 100 features, 47 classes at ``scale=1``."""
    return preset("products-like", scale, seed, device)


def papers_like(scale: float = 1.0, seed: int = 0, device: str | torch.device | None = None) -> Graph:
    """111,059,956 nodes, 1,615,685,872 edges, 128 features, 172 classes at ``scale=1``."""
    return preset("papers-like", scale, seed, device)
