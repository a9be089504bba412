// Single-GPU aggregation straight from the plan's local CSR: out[t] = rf[t] * sum_j w_j x[src_j]
// (+ diag[t] * x[t]), every output row written exactly once, no atomics, no zero-fill pass.
// Used when a rank has no remote work (P = 1). Calls no NVSHMEM function: built as a plain cubin
// (mgg.kernels.build.build_cubin("local_csr", nvshmem=False)).
//
// Layout
//   * x and out are [n, D4] float4 rows (Dp = 4 * D4 floats, D padded to a multiple of 4 as the
//     symmetric store does); x may be the caller's tensor when D % 4 == 0.
//   * CSR of the plan: indptr int64 [n + 1], src int32 [E] (local source rows), wt float32 [E].
//   * Lanes: L = min(32, pow2ceil(D4)) lanes per lane group, G = 32 / L groups per warp; lane
//     `lig` of a group owns the float4 columns lig, lig + L, ... (V of them, V = ceil(D4 / L)).
//   * Vectorised index loads: a batch of entries is loaded one index (and weight) per lane, U
//     registers per lane (U = 8 / L for L < 8, else 1); every group then takes K = L * U entries
//     of the batch, each broadcast from its owner lane with __shfl_sync. The next batch's indices
//     are loaded before the current batch's rows (software pipelining). Index and weight streams
//     use evict-first loads (__ldcs) and the output evict-first stores (__stcs), so the source
//     rows keep the L2.
//
// Weight modes (template W, picked once per plan on the host: mgg/kernels/local_csr.py)
//   0  weighted: w_j = wt[j] (per-edge weight array)           any plan
//   1  one:      w_j = 1, times rf[t] per row (rf may be null) sum; mean forward (rf = 1/deg)
//   2  column:   w_j = cf[src_j] (an n-float vector in L2),     gcn (cf = rf = dinv); mean
//                times rf[t] per row (rf may be null)           transposed (cf = 1/deg, rf null)
//
// Row -> work mapping (computed on the host once per plan and width class G: RowSchedule)
//   * long tasks int64 [n_long, 4] = (row, start, end, slot): one warp per task, all G groups on
//     the same row (group g takes entries g, g + G, ... of every 32 * U batch), groups combined
//     with __shfl_xor. slot < 0: the task is the whole row and writes out[row] (rf, diag fused);
//     slot >= 0: a chunk of a split hub row, writes its raw sum to partial[slot].
//   * short rows int32 [n_short]: rows packed G per warp (packed warp k takes rows
//     short_rows[k * G + g], group g one row, no cross-group reduction); the warp runs
//     max(batches) of its G rows, shorter rows predicate their tail off (rows are sorted by
//     degree, so the waste is small). Rows with no entry are here too: they write diag * x or 0.
//
// Kernels (one job each)
//   mgg_csr_rows_l{L}_v{V}_w{W}   warps [0, n_long) take long tasks (longest first), warps
//                                 [n_long, n_long + ceil(n_short / G)) packed rows;
//                                 block = 32 * wpb threads, grid = ceil(total warps / wpb), no
//                                 grid-stride loop (one task per warp).
//   mgg_csr_combine               one warp per split row (grid-stride): out[row] = rf[row] *
//                                 sum(partial[first .. first + count)) + diag[row] * x[row].
#include <cstdint>

#define FULL 0xffffffffu

namespace {

template <int L>
struct Geo {
  static constexpr int G = 32 / L;              // lane groups per warp
  static constexpr int U = L >= 8 ? 1 : 8 / L;  // index registers per lane per batch
  static constexpr int K = L * U;               // entries per group per batch
};

template <int V>
__device__ __forceinline__ void zero(float4 (&a)[V]) {
#pragma unroll
  for (int v = 0; v < V; ++v) a[v] = make_float4(0.f, 0.f, 0.f, 0.f);
}

template <int W>
__device__ __forceinline__ void axpy(float4& a, float w, const float4& r) {
  if (W == 1) {
    a.x += r.x; a.y += r.y; a.z += r.z; a.w += r.w;
  } else {
    a.x = fmaf(w, r.x, a.x); a.y = fmaf(w, r.y, a.y); a.z = fmaf(w, r.z, a.z); a.w = fmaf(w, r.w, a.w);
  }
}

// Load this lane's U indices (and weights) of the batch starting at `base`.
// WARP: position base + u * 32 + lane; group mode: base + u * L + lig.
template <int L, int W, bool WARP>
__device__ __forceinline__ void load_batch(long long base, long long e, int lane, int lig,
                                           const int* __restrict__ src, const float* __restrict__ wt,
                                           const float* __restrict__ cf, int (&idx)[Geo<L>::U],
                                           float (&wv)[Geo<L>::U]) {
#pragma unroll
  for (int u = 0; u < Geo<L>::U; ++u) {
    long long p = base + (WARP ? (long long)u * 32 + lane : (long long)u * L + lig);
    bool ok = p < e;
    int j = ok ? __ldcs(src + p) : -1;
    idx[u] = j;
    if (W == 0) wv[u] = ok ? __ldcs(wt + p) : 0.f;
    else if (W == 2) wv[u] = ok ? __ldg(cf + j) : 0.f;
    else wv[u] = 1.f;
  }
}

// Sum this group's entries of [s, e) into acc. Every lane of the warp must call it with the same
// `nbatch` (the shuffles are warp-wide).
template <int L, int V, int W, bool WARP>
__device__ __forceinline__ void accumulate(float4 (&acc)[V], long long s, long long e, int nbatch, int g,
                                           int lig, int lane, const int* __restrict__ src,
                                           const float* __restrict__ wt, const float* __restrict__ cf,
                                           const float4* __restrict__ x, int D4) {
  constexpr int G = Geo<L>::G, U = Geo<L>::U, K = Geo<L>::K;
  constexpr int STEP = WARP ? 32 * U : K;       // entries of a batch (per warp / per group)
  constexpr int UNR = V == 1 ? (K < 8 ? K : 8) : (V == 2 ? 4 : 2);  // rows in flight per lane
  int idx[U], nidx[U];
  float wv[U], nwv[U];
  load_batch<L, W, WARP>(s, e, lane, lig, src, wt, cf, nidx, nwv);
  for (int b = 0; b < nbatch; ++b) {
#pragma unroll
    for (int u = 0; u < U; ++u) { idx[u] = nidx[u]; wv[u] = nwv[u]; }
    if (b + 1 < nbatch)
      load_batch<L, W, WARP>(s + (long long)(b + 1) * STEP, e, lane, lig, src, wt, cf, nidx, nwv);
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += UNR) {
      float4 r[UNR][V];
      float w[UNR];
#pragma unroll
      for (int kk = 0; kk < UNR; ++kk) {
        const int k = k0 + kk;
        const int owner = WARP ? g + G * (k % L) : g * L + (k % L);
        int j = __shfl_sync(FULL, idx[k / L], owner);
        w[kk] = W == 1 ? 1.f : __shfl_sync(FULL, wv[k / L], owner);
        const float4* row = x + (long long)j * D4;
#pragma unroll
        for (int v = 0; v < V; ++v) {
          int c = lig + v * L;
          r[kk][v] = (j >= 0 && c < D4) ? __ldg(row + c) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
#pragma unroll
      for (int kk = 0; kk < UNR; ++kk)
#pragma unroll
        for (int v = 0; v < V; ++v) axpy<W>(acc[v], w[kk], r[kk][v]);
    }
  }
}

// out[t] = rf * acc + diag[t] * x[t] for this lane's columns.
template <int L, int V>
__device__ __forceinline__ void write_row(const float4 (&acc)[V], long long t, int lig,
                                          const float* __restrict__ rf, const float* __restrict__ diag,
                                          const float4* __restrict__ x, int D4, float4* __restrict__ out) {
  float f = rf ? rf[t] : 1.f;
  float d = diag ? diag[t] : 0.f;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    int c = lig + v * L;
    if (c < D4) {
      float4 a = acc[v];
      a.x *= f; a.y *= f; a.z *= f; a.w *= f;
      if (diag) {
        float4 xv = __ldg(x + t * D4 + c);
        a.x = fmaf(d, xv.x, a.x); a.y = fmaf(d, xv.y, a.y); a.z = fmaf(d, xv.z, a.z); a.w = fmaf(d, xv.w, a.w);
      }
      __stcs(out + t * D4 + c, a);
    }
  }
}

template <int L, int V, int W>
__device__ __forceinline__ void csr_rows_body(long long n_long, const long long* __restrict__ long_tasks,
                                              long long n_short, const int* __restrict__ short_rows,
                                              const long long* __restrict__ indptr, const int* __restrict__ src,
                                              const float* __restrict__ wt, const float* __restrict__ cf,
                                              const float* __restrict__ rf, const float* __restrict__ diag,
                                              const float4* __restrict__ x, int D4, float4* __restrict__ out,
                                              float4* __restrict__ partial) {
  constexpr int G = Geo<L>::G, U = Geo<L>::U, K = Geo<L>::K;
  const int lane = threadIdx.x & 31, g = lane / L, lig = lane % L;
  const long long gw = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  float4 acc[V];
  zero(acc);
  if (gw < n_long) {  // one row (or one chunk of a hub row), all groups
    const long long t = long_tasks[4 * gw], s = long_tasks[4 * gw + 1], e = long_tasks[4 * gw + 2];
    const long long slot = long_tasks[4 * gw + 3];
    const int nbatch = (int)((e - s + 32 * U - 1) / (32 * U));
    accumulate<L, V, W, true>(acc, s, e, nbatch, g, lig, lane, src, wt, cf, x, D4);
#pragma unroll
    for (int off = L; off < 32; off <<= 1)
#pragma unroll
      for (int v = 0; v < V; ++v) {
        acc[v].x += __shfl_xor_sync(FULL, acc[v].x, off);
        acc[v].y += __shfl_xor_sync(FULL, acc[v].y, off);
        acc[v].z += __shfl_xor_sync(FULL, acc[v].z, off);
        acc[v].w += __shfl_xor_sync(FULL, acc[v].w, off);
      }
    if (g != 0) return;
    if (slot < 0) {
      write_row<L, V>(acc, t, lig, rf, diag, x, D4, out);
    } else {
#pragma unroll
      for (int v = 0; v < V; ++v) {
        int c = lig + v * L;
        if (c < D4) partial[slot * D4 + c] = acc[v];
      }
    }
    return;
  }
  const long long k = gw - n_long;  // packed warp: G short rows, one per group
  if (k * G >= n_short) return;     // past the last packed warp (whole warp leaves together)
  const long long q = k * G + g;
  const long long t = q < n_short ? (long long)short_rows[q] : -1;
  long long s = 0, e = 0;
  if (t >= 0) { s = indptr[t]; e = indptr[t + 1]; }
  const int mine = (int)((e - s + K - 1) / K);
  const int nbatch = (int)__reduce_max_sync(FULL, (unsigned)mine);
  accumulate<L, V, W, false>(acc, s, e, nbatch, g, lig, lane, src, wt, cf, x, D4);
  if (t >= 0) write_row<L, V>(acc, t, lig, rf, diag, x, D4, out);
}

}  // namespace

#define DEF_ROWS(L, V, W)                                                                                \
  extern "C" __global__ void mgg_csr_rows_l##L##_v##V##_w##W(                                         \
      long long n_long, const long long* long_tasks, long long n_short, const int* short_rows,         \
      const long long* indptr, const int* src, const float* wt, const float* cf, const float* rf,      \
      const float* diag, const float4* x, int D4, float4* out, float4* partial) {                       \
    csr_rows_body<L, V, W>(n_long, long_tasks, n_short, short_rows, indptr, src, wt, cf, rf, diag, x, D4, \
                           out, partial);                                                               \
  }
#define DEF_ROWS_W(L, V) DEF_ROWS(L, V, 0) DEF_ROWS(L, V, 1) DEF_ROWS(L, V, 2)
DEF_ROWS_W(1, 1) DEF_ROWS_W(2, 1) DEF_ROWS_W(4, 1) DEF_ROWS_W(8, 1) DEF_ROWS_W(16, 1)
DEF_ROWS_W(32, 1) DEF_ROWS_W(32, 2) DEF_ROWS_W(32, 4)

// Second pass for hub rows split over several warps: split int64 [n_split, 3] = (row, first
// partial slot, number of slots).
extern "C" __global__ void mgg_csr_combine(long long n_split, const long long* __restrict__ split,
                                           const float4* __restrict__ partial, const float* __restrict__ rf,
                                           const float* __restrict__ diag, const float4* __restrict__ x,
                                           int D4, float4* __restrict__ out) {
  const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
  const long long warps = (long long)gridDim.x * wpb;
  for (long long i = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); i < n_split; i += warps) {
    const long long t = split[3 * i], first = split[3 * i + 1], count = split[3 * i + 2];
    const float f = rf ? rf[t] : 1.f;
    const float d = diag ? diag[t] : 0.f;
    for (int c = lane; c < D4; c += 32) {
      float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
      for (long long q = first; q < first + count; ++q) {
        float4 v = partial[q * D4 + c];
        a.x += v.x; a.y += v.y; a.z += v.z; a.w += v.w;
      }
      a.x *= f; a.y *= f; a.z *= f; a.w *= f;
      if (diag) {
        float4 xv = __ldg(x + t * D4 + c);
        a.x = fmaf(d, xv.x, a.x); a.y = fmaf(d, xv.y, a.y); a.z = fmaf(d, xv.z, a.z); a.w = fmaf(d, xv.w, a.w);
      }
      out[t * D4 + c] = a;
    }
  }
}
