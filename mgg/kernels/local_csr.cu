// Single-GPU aggregation straight from the plan's local CSR: out[t] = rf[t] * sum_j w_j x[src_j]
// (+ diag[t] * x[t]), every output row written once a pass by one warp, no zero-fill pass.
// Used when a rank has no remote work (P = 1). Calls no NVSHMEM function: built as a plain cubin
// (mgg.kernels.build.build_cubin("local_csr", nvshmem=False)).
//
// Layout
//   * x is [n, DV] rows of 16-byte vectors in the storage type S (template parameter, see Store
//     below): S = 0 float32 (a vector is a float4, D padded to a multiple of 4 as the symmetric
//     store does; x may be the caller's tensor when D % 4 == 0), S = 1 bfloat16 / S = 2 float16
//     (a vector is a uint4 of 8 elements, D padded to a multiple of 8). Every loaded vector is
//     converted to F4 = 1 (fp32) or 2 (16-bit) float4s in registers; sums are float32.
//   * out is float32 [n, DV * F4] float4 rows (Dp = 4 * DV * F4 floats), whatever S is.
//   * CSR of the plan: indptr int64 [n + 1], src int32 [E] (local source rows), wt float32 [E].
//   * Lanes: L = min(32, pow2ceil(DV)) lanes per lane group, G = 32 / L groups per warp; lane
//     `lig` of a group owns the storage vectors lig, lig + L, ... (V of them, V = ceil(DV / L)),
//     i.e. output float4 columns c * F4 .. c * F4 + F4 - 1 of each such vector c.
//   * Vectorised index loads: a batch of entries is loaded one index (and weight) per lane, U
//     registers per lane (U = 8 / L for L < 8, else 1); every group then takes K = L * U entries
//     of the batch, each broadcast from its owner lane with __shfl_sync. The next batch's indices
//     are loaded before the current batch's rows (software pipelining). Index and weight streams
//     use evict-first loads (__ldcs) and the output evict-first stores (__stcs), so the source
//     rows keep the L2.
//
// Weight modes (template W, picked once per plan on the host: mgg/kernels/csr_rows/weights.py)
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
//   * short items, G per warp (item warp k takes items k * G .. k * G + G - 1, group g one item,
//     no cross-group reduction): with runs = 0 an item is one row (int32 short_rows, sorted by
//     degree so the G rows of a warp have similar lengths: the packed mapping), with runs = 1 a
//     run of consecutive rows (int64 pairs r0, r1 of about the same number of entries: the
//     bundle mapping, one-vector layouts only). A group walks its item's entries as one stream
//     (walk_rows) and writes each row as the stream leaves it; the warp runs max(batches) of its
//     G items, shorter ones predicate their tail off. Rows with no entry are items too: they
//     write diag * x or 0. Each row's write values (rf, diag, the self row) are loaded when the
//     row starts, so that no write waits on a load.
//
// Kernels (one job each; the 16-bit storage forms carry a _bf16 / _fp16 suffix after "rows" /
// "combine": mgg_csr_rows_bf16_l{L}_v{V}_w{W}, mgg_csr_combine_fp16, ...)
//   mgg_csr_rows_l{L}_v{V}_w{W}   warps [0, n_long) take long tasks (longest first), warps
//                                 [n_long, n_long + ceil(n_items / G)) short items;
//                                 block = 32 * wpb threads, grid = ceil(total warps / wpb), no
//                                 grid-stride loop (one task per warp).
//   mgg_csr_scan{,_bf16,_fp16}_l{L}_w{W}  L = 2, 4, 8 (one quad of 4 columns a lane): warps [0, n_long) long
//                                 tasks as above, warp n_long + k the run of rows k (the scan
//                                 mapping; see its section below); block = 32 * SCAN_WPB (4)
//                                 threads, grid = ceil(total warps / SCAN_WPB).
//   mgg_csr_combine               one warp per split row (grid-stride): out[row] = rf[row] *
//                                 sum(partial[first .. first + count)) + diag[row] * x[row].
//   mgg_csr_scale_rows            out = cf * x row by row (the gcn pre-scale), 4 float4s a thread.
//   mgg_csr_table16{_bf16,_fp16}  out = round16(s * x) row by row, padded (a P = 1 call's 16-bit table).
//   The first three take `add`: 0 writes the row, 1 adds to what out[row] holds (a later source
//   segment's pass, or mgg/kernels/halo_csr.py's pass over the remote columns). A row is written
//   by one warp per pass and the passes are ordered on one stream, so no add needs an atomic;
//   the scan and combine kernels still add by one vector reduction (add_to_row) so that the SM
//   reads no out[row] (products-like D = 16 in three segments, 1.07-1.09x: one H200,
//   bench/results/2026-11-27-h200x1-612ad9f c1). The row kernels load out[row] with the row's
//   start (RowEnd): there the reduction took some layouts from 72 to 78 registers.
#include <climits>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// MGG_CSR_GATHER_ONLY (defined only by the benchmarks' gather floor, bench/harness/floors.py,
// never by the runtime): every row, partial and combine store is predicated on a sum no input
// makes, so the kernels read what they read for real and write nothing -- a bare gather in
// csr_rows' own schedule.
#ifdef MGG_CSR_GATHER_ONLY
#define MGG_CSR_STORE_IF(v) if ((v).x == -1.2345e30f)
#else
#define MGG_CSR_STORE_IF(v)
#endif

// MGG_CSR_STORAGE=S (0 float32, 1 bfloat16, 2 float16) and MGG_CSR_W=W (weight mode 0, 1, 2):
// only the entry points of storage dtype S and weight mode W (those without a mode -- combine,
// scale_rows (float32), table16 -- go with W = 0). The runtime builds the nine parts as separate
// cubins, in parallel, and a run builds those of its dtypes only (mgg.kernels.modules); a macro
// left undefined keeps every dtype, or every mode. MGG_CSR_L32=1 keeps only the row kernels of 32
// lanes (mgg_csr_rows*_l32_*, the widest rows: half of a part's compile time), MGG_CSR_L32=0 every
// other entry point, so that a (dtype, mode) builds as two cubins of about equal compile time.
#if defined(MGG_CSR_STORAGE) || defined(MGG_CSR_W) || defined(MGG_CSR_L32)
#pragma nv_diag_suppress 177  // helpers of the other dtypes and modes go unreferenced in a part
#endif
#if !defined(MGG_CSR_L32) || MGG_CSR_L32 == 1
#define MGG_CSR_ROWS32(def) def
#else
#define MGG_CSR_ROWS32(def)
#endif
#if !defined(MGG_CSR_L32) || MGG_CSR_L32 == 0
#define MGG_CSR_HAS_REST 1
#define MGG_CSR_REST(def) def
#else
#define MGG_CSR_HAS_REST 0
#define MGG_CSR_REST(def)
#endif
#ifdef MGG_CSR_STORAGE
#define MGG_CSR_HAS(S) (MGG_CSR_STORAGE == (S))
#else
#define MGG_CSR_HAS(S) 1
#endif
#ifdef MGG_CSR_W
#define MGG_CSR_HAS_W(W) (MGG_CSR_W == (W))
#else
#define MGG_CSR_HAS_W(W) 1
#endif
#if MGG_CSR_HAS_W(0)
#define MGG_CSR_W0(def) def
#else
#define MGG_CSR_W0(def)
#endif
#if MGG_CSR_HAS_W(1)
#define MGG_CSR_W1(def) def
#else
#define MGG_CSR_W1(def)
#endif
#if MGG_CSR_HAS_W(2)
#define MGG_CSR_W2(def) def
#else
#define MGG_CSR_W2(def)
#endif
#if MGG_CSR_HAS(0)
#define MGG_CSR_FP32(def) def
#else
#define MGG_CSR_FP32(def)
#endif
#if MGG_CSR_HAS(1)
#define MGG_CSR_BF16(def) def
#else
#define MGG_CSR_BF16(def)
#endif
#if MGG_CSR_HAS(2)
#define MGG_CSR_FP16(def) def
#else
#define MGG_CSR_FP16(def)
#endif

#define FULL 0xffffffffu

namespace {

// out[row] += a for one float4 of a row an earlier pass wrote, as one red.global.add.v4.f32
// (sm_90): the SM neither reads out[row] nor waits on it. The pass is the row's only writer, so
// the result is the load-add-store's, except that the reduction flushes a subnormal sum to zero.
__device__ __forceinline__ void add_to_row(float4* p, float4 a) { atomicAdd(p, a); }

// Storage element types: the 16-byte vector a lane loads, and its conversion to F4 float4s.
template <int S>
struct Store;
template <>
struct Store<0> {  // float32
  using vec = float4;
  static constexpr int F4 = 1;
  static __device__ __forceinline__ vec zero() { return make_float4(0.f, 0.f, 0.f, 0.f); }
  static __device__ __forceinline__ void unpack(const vec& v, float4 (&o)[F4]) { o[0] = v; }
};
template <>
struct Store<1> {  // bfloat16: the top 16 bits of a float32
  using vec = uint4;
  static constexpr int F4 = 2;
  static __device__ __forceinline__ vec zero() { return make_uint4(0u, 0u, 0u, 0u); }
  static __device__ __forceinline__ float lo(unsigned w) { return __uint_as_float(w << 16); }
  static __device__ __forceinline__ float hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
  static __device__ __forceinline__ void unpack(const vec& v, float4 (&o)[F4]) {
    o[0] = make_float4(lo(v.x), hi(v.x), lo(v.y), hi(v.y));
    o[1] = make_float4(lo(v.z), hi(v.z), lo(v.w), hi(v.w));
  }
};
template <>
struct Store<2> {  // float16 (IEEE half)
  using vec = uint4;
  static constexpr int F4 = 2;
  static __device__ __forceinline__ vec zero() { return make_uint4(0u, 0u, 0u, 0u); }
  static __device__ __forceinline__ float2 h2(unsigned w) {
    __half2 h = *reinterpret_cast<const __half2*>(&w);
    return __half22float2(h);
  }
  static __device__ __forceinline__ void unpack(const vec& v, float4 (&o)[F4]) {
    float2 a = h2(v.x), b = h2(v.y), c = h2(v.z), d = h2(v.w);
    o[0] = make_float4(a.x, a.y, b.x, b.y);
    o[1] = make_float4(c.x, c.y, d.x, d.y);
  }
};

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

// Load this lane's U indices (and weights) of the batch starting at position `base` of a stream
// of n entries (src / wt point at the stream's first entry: positions fit 32 bits, the launchers
// refuse 2^31 entries). WARP: position base + u * 32 + lane; group mode: base + u * L + lig.
template <int L, int W, bool WARP, int U = Geo<L>::U>
__device__ __forceinline__ void load_batch(int base, int n, int lane, int lig, const int* __restrict__ src,
                                           const float* __restrict__ wt, const float* __restrict__ cf,
                                           int (&idx)[U], float (&wv)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int p = base + (WARP ? u * 32 + lane : u * L + lig);
    const bool ok = p < n;
    const int j = ok ? __ldcs(src + p) : -1;
    idx[u] = j;
    if (W == 0) wv[u] = ok ? __ldcs(wt + p) : 0.f;
    else if (W == 2) wv[u] = ok ? __ldg(cf + j) : 0.f;
    else wv[u] = 1.f;
  }
}

// Rows of a batch a lane keeps in flight (loaded before any is summed).
template <int L, int V>
struct InFlight {
  static constexpr int K = Geo<L>::K;
  static constexpr int N = V == 1 ? (K < 8 ? K : 8) : (V == 2 ? 4 : 2);
};

// Entries k0 .. k0 + UNR - 1 of the current batch: each index (and weight) broadcast from the
// lane that loaded it (load_batch's layout), then this lane's vectors of each source row
// (zero past the stream's end, where the index is -1).
template <int S, int L, int V, int W, bool WARP, int UNR>
__device__ __forceinline__ void load_rows(int k0, const int (&idx)[Geo<L>::U], const float (&wv)[Geo<L>::U],
                                          int g, int lig, const typename Store<S>::vec* __restrict__ x, int DV,
                                          typename Store<S>::vec (&r)[UNR][V], float (&w)[UNR]) {
  constexpr int G = Geo<L>::G;
#pragma unroll
  for (int kk = 0; kk < UNR; ++kk) {
    const int k = k0 + kk;
    const int owner = WARP ? g + G * (k % L) : g * L + (k % L);
    const int j = __shfl_sync(FULL, idx[k / L], owner);
    w[kk] = W == 1 ? 1.f : __shfl_sync(FULL, wv[k / L], owner);
    const typename Store<S>::vec* row = x + (long long)j * DV;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int c = lig + v * L;
      r[kk][v] = (j >= 0 && c < DV) ? __ldg(row + c) : Store<S>::zero();
    }
  }
}

// acc += w * r for this lane's V storage vectors (V * F4 float4s).
template <int S, int V, int W>
__device__ __forceinline__ void add_row(float4 (&acc)[V * Store<S>::F4], float w, const typename Store<S>::vec (&r)[V]) {
#pragma unroll
  for (int v = 0; v < V; ++v) {
    float4 f[Store<S>::F4];
    Store<S>::unpack(r[v], f);
#pragma unroll
    for (int h = 0; h < Store<S>::F4; ++h) axpy<W>(acc[v * Store<S>::F4 + h], w, f[h]);
  }
}

// Sum this group's entries of [s, e) into acc. WARP (a long task): the warp's G groups on the
// same entries, group g taking entries g, g + G, ... of every batch of 32 * U; otherwise (one
// short row per group) the group's own entries, K per batch. Every lane of the warp calls it
// with the same `nbatch` (the shuffles are warp-wide).
template <int S, int L, int V, int W, bool WARP>
__device__ __forceinline__ void accumulate(float4 (&acc)[V * Store<S>::F4], long long s, long long e, int nbatch,
                                           int g, int lig, int lane, const int* __restrict__ src,
                                           const float* __restrict__ wt, const float* __restrict__ cf,
                                           const typename Store<S>::vec* __restrict__ x, int DV) {
  constexpr int U = Geo<L>::U, K = Geo<L>::K, UNR = InFlight<L, V>::N;
  constexpr int STEP = WARP ? 32 * U : K;  // entries of a batch (per warp / per group)
  const int n = (int)(e - s);
  src += s;
  if (W == 0) wt += s;
  int idx[U], nidx[U];
  float wv[U], nwv[U];
  load_batch<L, W, WARP>(0, n, lane, lig, src, wt, cf, nidx, nwv);
  for (int b = 0; b < nbatch; ++b) {
#pragma unroll
    for (int u = 0; u < U; ++u) { idx[u] = nidx[u]; wv[u] = nwv[u]; }
    if (b + 1 < nbatch) load_batch<L, W, WARP>((b + 1) * STEP, n, lane, lig, src, wt, cf, nidx, nwv);
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += UNR) {
      typename Store<S>::vec r[UNR][V];
      float w[UNR];
      load_rows<S, L, V, W, WARP, UNR>(k0, idx, wv, g, lig, x, DV, r, w);
#pragma unroll
      for (int kk = 0; kk < UNR; ++kk) add_row<S, V, W>(acc, w[kk], r[kk]);  // past e: zero rows
    }
  }
}

// What writing row t needs besides its sum: the row factor rf[t], the self weight diag[t] and, where
// diag is given, this lane's vectors of the self row x[t] (as stored). The row walk loads them
// when a row starts, so that they arrive while the row is summed and its write waits on no load.
// With `add` (a pass that adds to rows an earlier pass wrote) and float32 storage, xs holds out[t]
// instead where the row takes no self term (the same float4s; with one, out[t] is read at the write), loaded at the row's start too:
// loaded at the write, it cost every row of an adding pass a memory latency. Rows without entries
// in an adding pass are skipped (`empty`): they would add rf * 0.
template <int S, int V>
struct RowEnd {
  float f, d;
  typename Store<S>::vec xs[V];
};

template <int S, int L, int V>
__device__ __forceinline__ void load_row_end(RowEnd<S, V>& r, long long t, int lig, const float* __restrict__ rf,
                                             const float* __restrict__ diag,
                                             const typename Store<S>::vec* __restrict__ x, int DV,
                                             const float4* __restrict__ out, int add, bool empty) {
  r.f = rf ? __ldg(rf + t) : 1.f;
  r.d = diag ? __ldg(diag + t) : 0.f;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int c = lig + v * L;
    if constexpr (S == 0) {
      r.xs[v] = c >= DV ? Store<S>::zero()
                : diag ? __ldg(x + t * DV + c)
                : (add && !empty) ? __ldcg(out + t * DV + c) : Store<S>::zero();
    } else {
      r.xs[v] = (diag && c < DV) ? __ldg(x + t * DV + c) : Store<S>::zero();
    }
  }
}

// out[t] = f * acc + d * x[t] for this lane's columns; with `add`, plus what out[t] holds (for
// float32 storage r.xs, loaded with the row's start; see RowEnd), and nothing for an `empty` row.
template <int S, int L, int V>
__device__ __forceinline__ void write_row(const float4 (&acc)[V * Store<S>::F4], long long t, int lig,
                                          const RowEnd<S, V>& r, bool has_diag, int DV,
                                          float4* __restrict__ out, int add, bool empty = false) {
  using T = Store<S>;
  constexpr int F4 = T::F4;
  if (S == 0 && add && empty) return;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    int c = lig + v * L;
    if (c < DV) {
      float4 xv[F4];
      T::unpack(r.xs[v], xv);
#pragma unroll
      for (int h = 0; h < F4; ++h) {
        float4 a = acc[v * F4 + h];
        a.x *= r.f; a.y *= r.f; a.z *= r.f; a.w *= r.f;
        if (has_diag) {
          a.x = fmaf(r.d, xv[h].x, a.x); a.y = fmaf(r.d, xv[h].y, a.y);
          a.z = fmaf(r.d, xv[h].z, a.z); a.w = fmaf(r.d, xv[h].w, a.w);
        }
        if (add) {  // a later pass (remote columns, another source segment) adds to the row
          const float4 o = S == 0 && !has_diag ? xv[h] : out[(t * DV + c) * F4 + h];
          a.x += o.x; a.y += o.y; a.z += o.z; a.w += o.w;
        }
        MGG_CSR_STORE_IF(a) __stcs(out + (t * DV + c) * F4 + h, a);
      }
    }
  }
}

// One long task (a whole row, or a chunk of a split hub row) by the whole warp: all G groups on
// the same entries, combined with __shfl_xor; writes out[row] (slot < 0; with the self term where
// dlo <= row < dhi) or partial[slot].
template <int S, int L, int V, int W>
__device__ __forceinline__ void long_task(long long gw, const long long* __restrict__ long_tasks,
                                          const int* __restrict__ src, const float* __restrict__ wt,
                                          const float* __restrict__ cf, const float* __restrict__ rf,
                                          const float* __restrict__ diag,
                                          const typename Store<S>::vec* __restrict__ x, int DV,
                                          float4* __restrict__ out, float4* __restrict__ partial, int add,
                                          long long dlo = 0, long long dhi = LLONG_MAX) {
  constexpr int U = Geo<L>::U, F4 = Store<S>::F4, A = V * F4;
  const int lane = threadIdx.x & 31, g = lane / L, lig = lane % L;
  float4 acc[A];
  zero(acc);
  const long long t = long_tasks[4 * gw], s = long_tasks[4 * gw + 1], e = long_tasks[4 * gw + 2];
  const long long slot = long_tasks[4 * gw + 3];
  const int nbatch = (int)((e - s + 32 * U - 1) / (32 * U));
  accumulate<S, L, V, W, true>(acc, s, e, nbatch, g, lig, lane, src, wt, cf, x, DV);
#pragma unroll
  for (int off = L; off < 32; off <<= 1)
#pragma unroll
    for (int v = 0; v < A; ++v) {
      acc[v].x += __shfl_xor_sync(FULL, acc[v].x, off);
      acc[v].y += __shfl_xor_sync(FULL, acc[v].y, off);
      acc[v].z += __shfl_xor_sync(FULL, acc[v].z, off);
      acc[v].w += __shfl_xor_sync(FULL, acc[v].w, off);
    }
  if (g != 0) return;
  if (slot < 0) {
    const float* __restrict__ dg = t >= dlo && t < dhi ? diag : nullptr;  // the rows this pass adds the self term to
    RowEnd<S, V> r;
    load_row_end<S, L, V>(r, t, lig, rf, dg, x, DV, out, add, false);
    write_row<S, L, V>(acc, t, lig, r, dg != nullptr, DV, out, add);
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      int c = lig + v * L;
      if (c < DV)
#pragma unroll
        for (int h = 0; h < F4; ++h) MGG_CSR_STORE_IF(acc[v * F4 + h]) partial[(slot * DV + c) * F4 + h] = acc[v * F4 + h];
    }
  }
}

// The consecutive short rows [r0, r1) by one lane group (one row in the packed mapping, a run
// of rows in the bundle mapping): the group walks their entries [s, e) = [indptr[r0],
// indptr[r1]) as one stream, K per batch with the next batch's indices in flight, and writes each
// row when the stream leaves it (rows without entries included). A row's write values (RowEnd)
// and the end of the row after it are loaded when the row starts, so a row change waits on no
// load, and in a run a row's short tail does not idle the group: the next row starts inside the
// batch. Every lane of the warp calls it with the same `nbatch` (the shuffles are warp-wide).
// (Sixteen entries per batch with 16 rows in flight per lane were slower on one H200: register
// pressure.)
template <int S, int L, int V, int W>
__device__ __forceinline__ void walk_rows(long long r0, long long r1, long long s, long long e, int nbatch, int g,
                                          int lig, int lane, const long long* __restrict__ indptr,
                                          const int* __restrict__ src, const float* __restrict__ wt,
                                          const float* __restrict__ cf, const float* __restrict__ rf,
                                          const float* __restrict__ diag,
                                          const typename Store<S>::vec* __restrict__ x, int DV,
                                          float4* __restrict__ out, int add) {
  using T = Store<S>;
  constexpr int U = Geo<L>::U, K = Geo<L>::K, A = V * T::F4, UNR = InFlight<L, V>::N;
  const bool has_diag = diag != nullptr;
  float4 acc[A];
  zero(acc);
  // positions relative to s (32 bits: the launchers refuse 2^31 entries or rows)
  const int n = (int)(e - s);
  src += s;
  if (W == 0) wt += s;
  const long long* ends = indptr + 1;                          // ends[t] = indptr[t + 1]
  int t = (int)r0;                                             // the row being summed
  const int tl = (int)r1;
  int tend = t + 1 < tl ? (int)(ends[t] - s) : n;              // its end in the entry stream
  int tnext = t + 2 < tl ? (int)(ends[t + 1] - s) : n;         // the end of row t + 1 (when t + 1 < r1)
  RowEnd<S, V> rend;
  bool summed = false;                                         // row t has had an entry
  if (t < tl) load_row_end<S, L, V>(rend, t, lig, rf, diag, x, DV, out, add, tend == 0);
  int idx[U], nidx[U];
  float wv[U], nwv[U];
  load_batch<L, W, false, U>(0, n, lane, lig, src, wt, cf, nidx, nwv);
  for (int b = 0; b < nbatch; ++b) {
    const int base = b * K;
#pragma unroll
    for (int u = 0; u < U; ++u) { idx[u] = nidx[u]; wv[u] = nwv[u]; }
    if (b + 1 < nbatch) load_batch<L, W, false, U>(base + K, n, lane, lig, src, wt, cf, nidx, nwv);
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += UNR) {
      typename T::vec r[UNR][V];
      float w[UNR];
      load_rows<S, L, V, W, false, UNR>(k0, idx, wv, g, lig, x, DV, r, w);
#pragma unroll
      for (int kk = 0; kk < UNR; ++kk) {
        const int p = base + k0 + kk;
        if (p < n) {
          while (p >= tend) {  // the stream left row t: write it, start the next
            write_row<S, L, V>(acc, t, lig, rend, has_diag, DV, out, add, !summed);
            zero(acc);
            summed = false;
            ++t;
            load_row_end<S, L, V>(rend, t, lig, rf, diag, x, DV, out, add, tnext == tend);
            tend = tnext;
            tnext = t + 2 < tl ? (int)(ends[t + 1] - s) : n;
          }
          add_row<S, V, W>(acc, w[kk], r[kk]);
          summed = true;
        }
      }
    }
  }
  while (t < tl) {  // the last row with entries, then the empty rows after it
    write_row<S, L, V>(acc, t, lig, rend, has_diag, DV, out, add, !summed);
    zero(acc);
    summed = false;
    if (++t < tl) load_row_end<S, L, V>(rend, t, lig, rf, diag, x, DV, out, add, true);
  }
}

// Warps [0, n_long) take long tasks (longest first); warp n_long + k takes short items
// k * G .. k * G + G - 1, one per lane group: with runs = 0 an item is one row (int32
// items[q], the packed mapping), with runs = 1 a run of consecutive rows (int64 items[2q],
// items[2q + 1] = r0, r1: the bundle mapping).
template <int S, int L, int V, int W>
__device__ __forceinline__ void csr_rows_body(long long n_long, const long long* __restrict__ long_tasks,
                                              long long n_items, const void* __restrict__ items, int runs,
                                              const long long* __restrict__ indptr, const int* __restrict__ src,
                                              const float* __restrict__ wt, const float* __restrict__ cf,
                                              const float* __restrict__ rf, const float* __restrict__ diag,
                                              const typename Store<S>::vec* __restrict__ x, int DV,
                                              float4* __restrict__ out, float4* __restrict__ partial, int add) {
  constexpr int G = Geo<L>::G, K = Geo<L>::K;
  const int lane = threadIdx.x & 31, g = lane / L, lig = lane % L;
  const long long gw = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (gw < n_long) {  // one row (or one chunk of a hub row), all groups
    long_task<S, L, V, W>(gw, long_tasks, src, wt, cf, rf, diag, x, DV, out, partial, add);
    return;
  }
  const long long k = gw - n_long;
  if (k * G >= n_items) return;  // past the last item warp (whole warp leaves together)
  const long long q = k * G + g;
  long long r0 = 0, r1 = 0, s = 0, e = 0;
  if (q < n_items) {
    if (runs) {
      r0 = static_cast<const long long*>(items)[2 * q];
      r1 = static_cast<const long long*>(items)[2 * q + 1];
    } else {
      r0 = static_cast<const int*>(items)[q];
      r1 = r0 + 1;
    }
    s = indptr[r0];
    e = indptr[r1];
  }
  const int mine = (int)((e - s + K - 1) / K);
  const int nbatch = (int)__reduce_max_sync(FULL, (unsigned)mine);
  if constexpr (V == 1) {
    walk_rows<S, L, V, W>(r0, r1, s, e, nbatch, g, lig, lane, indptr, src, wt, cf, rf, diag, x, DV, out, add);
  } else {  // wide rows: one row per group (runs = 0; the host schedules no runs for V > 1)
    float4 acc[V * Store<S>::F4];
    zero(acc);
    RowEnd<S, V> rend;
    if (r0 < r1) load_row_end<S, L, V>(rend, r0, lig, rf, diag, x, DV, out, add, false);  // in flight during the sum
    accumulate<S, L, V, W, false>(acc, s, e, nbatch, g, lig, lane, src, wt, cf, x, DV);
    if (r0 < r1) write_row<S, L, V>(acc, r0, lig, rend, diag != nullptr, DV, out, add);
  }
}

// ---------------------------------------------------------------------------------------------
// The scan mapping (mgg_csr_scan{,_bf16,_fp16}_l{L}_w{W}; one quad of 4 columns a lane, ScanQuad, L = 2, 4, 8):
// a warp takes a run of consecutive short rows (int64 runs[2k], runs[2k + 1] = r0, r1) and walks
// their entries [indptr[r0], indptr[r1]) as one stream, in windows of ScanGeo<L>::W = 8 * G
// entries (G = 32 / L lane groups; group g takes window entries 8g .. 8g + 7, 8 rows in flight a
// lane; a lane loads the window's indices it hands out, U = 8 / L of them, as one aligned vector,
// so the launcher needs src and wt aligned to 4 U bytes). No row change diverges:
//   * the window's row ends come from the row ends the warp holds (lane i: the end of row rc + i,
//     one coalesced load for 32 rows) as a bit a window entry, OR-reduced over the warp;
//   * each group keeps a running sum of its 8 entries and stores it into shared memory at every row
//     end (predicated), restarting from zero;
//   * a segmented scan over the groups' tails (log2 G shuffle steps) gives each group what earlier
//     groups, and earlier windows (the carry), hold of its first row;
//   * the window's completed rows are written G at a time, one row a group: coalesced stores.
// Shared memory: ScanGeo<L>::SLOTS float4s a warp (one a lane and window entry, plus one a group of
// entries against bank conflicts), SCAN_WPB warps a block. The per-row write values (rf, diag, the
// self row) are loaded at the write (an adding pass reads no out[t]: add_to_row): loading them
// before the gathers took the kernel from 72 to 102 registers (one H200, bench/results/2026-11-27-h200x1-b6415bd c2).
// `ends_rf` (or null): the row ends with rf[t]'s bits in their high words, so that a run loads no rf.
// The self term diag[t] * x[t] goes to rows dlo <= t < dhi only: a source segment's pass adds it to
// the rows of its own source range, whose x rows its gathers bring into the L2; with `self_rf` the
// runs take the self weight to be the row factor (GCN's diag / cf = rf) and load no diag.
#define SCAN_WPB 4

template <int L>
struct ScanGeo {
  static constexpr int G = 32 / L;             // lane groups
  static constexpr int W = 8 * G;              // entries a window
  static constexpr int U = 8 / L;              // indices a lane loads a window
  static constexpr int NW = W / 32;            // 32-bit words of row-end flags a window
  static constexpr int SLOTS = W * L + W / 8;  // float4 slots a warp
};

template <int L>
__device__ __forceinline__ int scan_slot(int p, int lig) { return p * L + lig + (p >> 3); }

// U consecutive int32 (float) as one load: the scan windows' index (weight) vectors
template <int U> struct ScanVec;
template <> struct ScanVec<1> { using I = int; using F = float; };
template <> struct ScanVec<2> { using I = int2; using F = float2; };
template <> struct ScanVec<4> { using I = int4; using F = float4; };

__device__ __forceinline__ float4 f4add(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }
__device__ __forceinline__ float4 f4shfl_up(float4 v, int d) {
  return make_float4(__shfl_up_sync(FULL, v.x, d), __shfl_up_sync(FULL, v.y, d), __shfl_up_sync(FULL, v.z, d),
                     __shfl_up_sync(FULL, v.w, d));
}
__device__ __forceinline__ float4 f4shfl(float4 v, int l) {
  return make_float4(__shfl_sync(FULL, v.x, l), __shfl_sync(FULL, v.y, l), __shfl_sync(FULL, v.z, l),
                     __shfl_sync(FULL, v.w, l));
}

// `bytes` (a multiple of 16) from p (16-byte aligned) into the L2, no register written
__device__ __forceinline__ void scan_prefetch_l2(const void* p, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// One lane's 4 values of a stored row as float32: a float4 (float32 storage) or 4 16-bit values
// in 8 bytes (bf16, fp16), so that every storage runs the scan with one lane a 4-column quad and
// the same lane groups, slots and scan as float32 (a 16-bit D = 16 row is 4 lanes of 8 bytes).
// A window's gathers are held as R until summed (`fetch`, then `sum_form`): fp16 keeps its rows
// packed, which took mgg_csr_scan_fp16_l2_w0 from 180 to 76 bytes of spill and its w1 kernels to
// none; bf16 (whose unpack is a shift or a mask) spilled more that way (l2_w0 40 -> 76), so it
// unpacks at the load. `load`: one quad as float32 (the self row).
template <int S> struct ScanQuad;
template <> struct ScanQuad<0> {
  using T = float4;
  using R = float4;
  static __device__ __forceinline__ float4 load(const T* p) { return __ldg(p); }
  static __device__ __forceinline__ R fetch(const T* p) { return __ldg(p); }
  static __device__ __forceinline__ float4 sum_form(const R& v) { return v; }
};
template <> struct ScanQuad<1> {
  using T = uint2;
  using R = float4;
  static __device__ __forceinline__ float4 load(const T* p) {
    const uint2 v = __ldg(p);
    return make_float4(Store<1>::lo(v.x), Store<1>::hi(v.x), Store<1>::lo(v.y), Store<1>::hi(v.y));
  }
  static __device__ __forceinline__ R fetch(const T* p) { return load(p); }
  static __device__ __forceinline__ float4 sum_form(const R& v) { return v; }
};
template <> struct ScanQuad<2> {
  using T = uint2;
  using R = uint2;
  static __device__ __forceinline__ float4 sum_form(const R& v) {
    const float2 a = Store<2>::h2(v.x), b = Store<2>::h2(v.y);
    return make_float4(a.x, a.y, b.x, b.y);
  }
  static __device__ __forceinline__ float4 load(const T* p) { return sum_form(__ldg(p)); }
  static __device__ __forceinline__ R fetch(const T* p) { return __ldg(p); }
};

// OR into `words` the flag bit of every row of this lane's chunk entry (row end cend, previous row's
// end prev; relative positions) whose last entry lies in the window [b, b + W).
template <int L>
__device__ __forceinline__ void scan_end_bits(int cend, int prev, int b, unsigned (&words)[ScanGeo<L>::NW]) {
  const int q = cend - 1 - b;
  const bool in = cend > prev && q >= 0 && q < ScanGeo<L>::W;
#pragma unroll
  for (int w = 0; w < ScanGeo<L>::NW; ++w)
    words[w] |= __reduce_or_sync(FULL, (in && (q >> 5) == w) ? (1u << (q & 31)) : 0u);
}

// A run's row-end word ev = ends[t] (entries < 2^31): row t's end relative to the run's base s
// (its low 32 bits), and with ends_rf's rows the row factor rf[t] (its high 32 bits). Macros, not
// functions: as two __forceinline__ functions, even these expressions changed the register
// allocation of the scan kernels (ptxas, CUDA 13.0); as macros their SASS is unchanged.
#define MGG_SCAN_END(ev, s) ((int)(((ev) & 0xffffffffll) - (s)))
#define MGG_SCAN_RF(ev) (__int_as_float((int)((ev) >> 32)))

// Run [r0, r1) (every row of it short; empty rows too) by one warp; see the section comment.
// `slots`: this warp's ScanGeo<L>::SLOTS float4s of shared memory.
template <int L, int W, int S>
__device__ __forceinline__ void scan_run(long long r0, long long r1, const long long* __restrict__ indptr,
                                         const int* __restrict__ src, const float* __restrict__ wt,
                                         const float* __restrict__ cf, const float* __restrict__ rf,
                                         const float* __restrict__ diag, const void* __restrict__ x, int DV,
                                         float4* __restrict__ out, int add, float4* __restrict__ slots,
                                         const long long* __restrict__ ends_rf, long long dlo, long long dhi,
                                         int self_rf) {
  using Q = ScanGeo<L>;
  constexpr int G = Q::G, WIN = Q::W, U = Q::U, NW = Q::NW;
  const int lane = threadIdx.x & 31, g = lane / L, lig = lane % L;
  // positions are relative to s, the run's first entry rounded down to a multiple of U, so that a
  // lane's U indices of a window are one aligned vector load; the a0 entries before the run's first
  // row sum into a phantom row (a row end flagged at a0 - 1 in window 0) that nothing writes
  const long long s_run = indptr[r0];
  const int a0 = (int)(s_run & (U - 1));
  const long long s = s_run - a0;
  const int n = (int)(indptr[r1] - s);  // positions relative to s (the launcher refuses 2^31 entries)
  src += s;
  if (W == 0) wt += s;
  // row t's end: ends[t]'s low 32 bits (entries < 2^31); with ends_rf, its high 32 bits hold rf[t]'s
  // bits, so that the row factor comes with the row end instead of one more load a window
  if (W != 1) ends_rf = nullptr;  // unit weights only: elsewhere its register spilled (l4_w0 8 -> 52 bytes)
  const long long* ends = ends_rf ? ends_rf : indptr + 1;
  long long rc = r0;  // the first row not yet written; lane i holds the end of row rc + i (and its rf)
  bool in = rc + lane < r1;
  long long ev = in ? ends[rc + lane] : 0ll;
  int cend = in ? MGG_SCAN_END(ev, s) : INT_MAX;
  float rfl = ends_rf && in ? MGG_SCAN_RF(ev) : 1.f;
  int pend = a0;      // the end of row rc - 1
  float4 carry = make_float4(0.f, 0.f, 0.f, 0.f);  // the part of the row in progress that earlier windows hold
  const bool lok = lig < DV;
  // a gathered vector's address in one multiply-add: row j's vector lig at xg + j * rowb (lanes past
  // the row's DV vectors read its vector 0 and write nothing; entries past the run read row 0 and
  // land after its last row end, in sums no row takes). The predicated 64-bit form it replaced took
  // about 17 instructions a gather; one H200, products-like D = 16 (bench/results/
  // 2026-11-27-h200x1-52bd5e5): 1.10x on one machine (c4), even on another (c5).
  using QD = ScanQuad<S>;
  const typename QD::T* __restrict__ xq = reinterpret_cast<const typename QD::T*>(x);  // DV quads a row
  const char* __restrict__ xg = reinterpret_cast<const char*>(xq + (lok ? lig : 0));
  const unsigned rowb = (unsigned)sizeof(typename QD::T) * (unsigned)DV;
  int idx[U], nidx[U];
  float wv[U], nwv[U];
  // window b's indices: lane * U + u, one vector load (a lane's U indices as one request: one H200,
  // products-like, bench/results/2026-11-27-h200x1-eeddff8 c4: D = 8 1.08-1.14x, cf[src] per edge
  // 1.05-1.10x, D = 16 even); the window past the run's last entry loads entry by entry
  auto load = [&](int b, int (&ix)[U], float (&w)[U]) {
    const int p0 = b + lane * U;
    if (p0 + U <= n) {  // one aligned vector (s and b are multiples of U)
      const typename ScanVec<U>::I v = __ldcs(reinterpret_cast<const typename ScanVec<U>::I*>(src + p0));
#pragma unroll
      for (int u = 0; u < U; ++u) ix[u] = reinterpret_cast<const int*>(&v)[u];
      if (W == 0) {
        const typename ScanVec<U>::F f = __ldcs(reinterpret_cast<const typename ScanVec<U>::F*>(wt + p0));
#pragma unroll
        for (int u = 0; u < U; ++u) w[u] = reinterpret_cast<const float*>(&f)[u];
      }
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const bool ok = p0 + u < n;
        ix[u] = ok ? __ldcs(src + p0 + u) : -1;
        if (W == 0) w[u] = ok ? __ldcs(wt + p0 + u) : 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (W == 2) w[u] = ix[u] >= 0 ? __ldg(cf + ix[u]) : 0.f;
      else if (W == 1) w[u] = 1.f;
    }
  };
  load(0, nidx, nwv);
  for (int b = 0;; b += WIN) {
#pragma unroll
    for (int u = 0; u < U; ++u) { idx[u] = nidx[u]; wv[u] = nwv[u]; }
    if (b + WIN < n) load(b + WIN, nidx, nwv);
    // window entry 8g + k was loaded by lane g * L + k / U, register k % U
    typename QD::R r[8];
    float w[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int j = __shfl_sync(FULL, idx[k % U], g * L + k / U);
      w[k] = W == 1 ? 1.f : __shfl_sync(FULL, wv[k % U], g * L + k / U);
      r[k] = QD::fetch(reinterpret_cast<const typename QD::T*>(xg + (unsigned long long)(unsigned)max(j, 0) * rowb));
    }
    unsigned words[NW];
#pragma unroll
    for (int q = 0; q < NW; ++q) words[q] = 0u;
    {
      int prev = __shfl_up_sync(FULL, cend, 1);
      if (lane == 0) prev = pend;
      scan_end_bits<L>(cend, prev, b, words);
#ifndef MGG_SCAN_NO_WRITE_PF
      // the chunk's rows that complete in the next window: their self rows into the L2 now, a
      // window ahead of their write (their out rows were prefetched too while an adding pass
      // read them at the write). One H200 each, products-like D = 16
      // (bench/results/2026-11-27-h200x1-a28b5e5 c3, c4): sum 1.01-1.03x, gcn 1.01-1.03x; with
      // add_to_row, the out rows' prefetch was even (-612ad9f c1); D = 32 even; not at
      // L = 2, where its registers spill (20 -> 40 bytes) and D = 8 lost 7-9%, nor with weights a
      // gather (l4_w0 / w2 spill 24 -> 40 bytes)
      if constexpr (L >= 4 && W == 1) {
        if (cend > b + WIN && cend <= b + 2 * WIN) {
          const long long t = rc + lane;
          if (diag && t >= dlo && t < dhi) scan_prefetch_l2(xq + t * DV, rowb);
        }
      }
#endif
      if (a0 && b == 0) words[0] |= 1u << (a0 - 1);  // the phantom row before the run
      long long rr = rc;  // every row of the chunk ends in the window: the next chunks may too
      int ce = cend;
      while (__shfl_sync(FULL, ce, 31) <= b + WIN && rr + 32 < r1) {
        const int last = __shfl_sync(FULL, ce, 31);
        rr += 32;
        ce = rr + lane < r1 ? MGG_SCAN_END(ends[rr + lane], s) : INT_MAX;
        int pv = __shfl_up_sync(FULL, ce, 1);
        if (lane == 0) pv = last;
        scan_end_bits<L>(ce, pv, b, words);
      }
    }
    unsigned wsel = words[0];
#pragma unroll
    for (int q = 1; q < NW; ++q)
      if (((8 * g) >> 5) == q) wsel = words[q];
    const unsigned fl = (wsel >> ((8 * g) & 31)) & 0xffu;  // this group's 8 flags
    float4 run = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      axpy<W>(run, w[k], QD::sum_form(r[k]));
      if ((fl >> k) & 1u) {
        slots[scan_slot<L>(8 * g + k, lig)] = run;
        run = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    // segmented scan over the groups: v_g = tail_g + (group g ends no row ? v_{g-1} : 0)
    const unsigned bal = __ballot_sync(FULL, fl != 0u);
    unsigned gm = 0;  // bit q: group q ends a row
#pragma unroll
    for (int q = 0; q < G; ++q) gm |= ((bal >> (q * L)) & 1u) << q;
    float4 v = run;
#pragma unroll
    for (int d = 1; d < G; d <<= 1) {
      const float4 up = f4shfl_up(v, d * L);
      const int a = g - d + 1 > 0 ? g - d + 1 : 0;  // v covers groups [a, g]: add v_{g-d} if none ends a row
      const bool stop = ((gm >> a) & ((2u << (g - a)) - 1u)) != 0u;
      if (g >= d && !stop) v = f4add(v, up);
    }
    if ((gm & ((2u << g) - 1u)) == 0u) v = f4add(v, carry);  // no row end in groups 0..g
    float4 cin = f4shfl_up(v, L);
    if (g == 0) cin = carry;
    carry = f4shfl(v, (G - 1) * L + lig);
    if (fl) {  // the group's first row end gets what came before it
      const int sl = scan_slot<L>(8 * g + __ffs(fl) - 1, lig);
      slots[sl] = f4add(slots[sl], cin);
    }
    __syncwarp();
    // the window's completed rows (end <= b + WIN), G at a time; 32 rows of ends a chunk
    while (true) {
      const int nc = __popc(__ballot_sync(FULL, cend <= b + WIN));
      for (int j0 = 0; j0 < nc; j0 += G) {
        const int j = j0 + g;
        const int ej = __shfl_sync(FULL, cend, j & 31);
        int pj = __shfl_sync(FULL, cend, (j - 1) & 31);
        if (j == 0) pj = pend;
        const float fj = ends_rf ? __shfl_sync(FULL, rfl, j & 31) : 1.f;
        if (j < nc && lok) {
          const long long t = rc + j;
          const bool ne = ej > pj;
          float4 a = ne ? slots[scan_slot<L>(ej - 1 - b, lig)] : make_float4(0.f, 0.f, 0.f, 0.f);
          const float f = ends_rf ? fj : rf ? __ldg(rf + t) : 1.f;
          a.x *= f; a.y *= f; a.z *= f; a.w *= f;
          const bool self = diag && t >= dlo && t < dhi;  // this pass adds row t's self term
          if (self) {
            const float d = self_rf ? f : __ldg(diag + t);
            const float4 xs = QD::load(xq + t * DV + lig);
            a.x = fmaf(d, xs.x, a.x); a.y = fmaf(d, xs.y, a.y); a.z = fmaf(d, xs.z, a.z); a.w = fmaf(d, xs.w, a.w);
          }
          if (add) {
            if (ne || self) {
              MGG_CSR_STORE_IF(a) add_to_row(out + t * DV + lig, a);
            }
          } else {
            MGG_CSR_STORE_IF(a) __stcs(out + t * DV + lig, a);
          }
        }
      }
      if (nc == 32) {  // the whole chunk is written: the next 32 rows
        pend = __shfl_sync(FULL, cend, 31);
        rc += 32;
        in = rc + lane < r1;
        ev = in ? ends[rc + lane] : 0ll;
        cend = in ? MGG_SCAN_END(ev, s) : INT_MAX;
        if (ends_rf) rfl = in ? MGG_SCAN_RF(ev) : 1.f;
        continue;
      }
      if (nc) {
        pend = __shfl_sync(FULL, cend, nc - 1);
        rc += nc;
        const bool kept = lane + nc < 32;
        const int sh = __shfl_down_sync(FULL, cend, nc);
        in = !kept && rc + lane < r1;
        ev = in ? ends[rc + lane] : 0ll;
        cend = kept ? sh : (in ? MGG_SCAN_END(ev, s) : INT_MAX);
        if (ends_rf) {
          const float fs = __shfl_down_sync(FULL, rfl, nc);
          rfl = kept ? fs : (in ? MGG_SCAN_RF(ev) : 1.f);
        }
      }
      break;
    }
    __syncwarp();
    if (b + WIN >= n) break;
  }
}

// Warps [0, n_long) take long tasks (as mgg_csr_rows), warp n_long + k run k.
template <int L, int W, int S>
__device__ __forceinline__ void csr_scan_body(long long n_long, const long long* __restrict__ long_tasks,
                                              long long n_runs, const long long* __restrict__ runs,
                                              const long long* __restrict__ indptr, const int* __restrict__ src,
                                              const float* __restrict__ wt, const float* __restrict__ cf,
                                              const float* __restrict__ rf, const float* __restrict__ diag,
                                              const void* __restrict__ x, int DV, float4* __restrict__ out,
                                              float4* __restrict__ partial, int add,
                                              const long long* __restrict__ ends_rf, long long dlo, long long dhi,
                                              int self_rf) {
  __shared__ float4 slots[SCAN_WPB][ScanGeo<L>::SLOTS];
  const long long gw = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (gw < n_long) {
    if constexpr (S == 0)
      long_task<0, L, 1, W>(gw, long_tasks, src, wt, cf, rf, diag, reinterpret_cast<const float4*>(x), DV, out,
                            partial, add, dlo, dhi);
    else  // a row of DV quads is DV / 2 16-byte vectors of 8 values, on L lanes (the upper half
          // idle: L / 2 lanes took the L = 2 kernels from 0-40 to 172-276 bytes of spill)
      long_task<S, L, 1, W>(gw, long_tasks, src, wt, cf, rf, diag, reinterpret_cast<const uint4*>(x), DV / 2,
                            out, partial, add, dlo, dhi);
    return;
  }
  const long long k = gw - n_long;
  if (k >= n_runs) return;
  scan_run<L, W, S>(runs[2 * k], runs[2 * k + 1], indptr, src, wt, cf, rf, diag, x, DV, out, add,
                    slots[threadIdx.x >> 5], ends_rf, dlo, dhi, self_rf);
}

// Second pass for hub rows split over several warps (see mgg_csr_combine below).
template <int S>
__device__ __forceinline__ void csr_combine_body(long long n_split, const long long* __restrict__ split,
                                                 const float4* __restrict__ partial, const float* __restrict__ rf,
                                                 const float* __restrict__ diag_all,
                                                 const typename Store<S>::vec* __restrict__ x, int DV,
                                                 float4* __restrict__ out, int add, long long dlo,
                                                 long long dhi) {
  using T = Store<S>;
  constexpr int F4 = T::F4;
  const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
  const long long warps = (long long)gridDim.x * wpb;
  for (long long i = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); i < n_split; i += warps) {
    const long long t = split[3 * i], first = split[3 * i + 1], count = split[3 * i + 2];
    const float* __restrict__ diag = t >= dlo && t < dhi ? diag_all : nullptr;  // this pass's self-term rows
    const float f = rf ? rf[t] : 1.f;
    const float d = diag ? diag[t] : 0.f;
    for (int c = lane; c < DV; c += 32) {
      float4 xv[F4];
      if (diag) T::unpack(__ldg(x + t * DV + c), xv);
#pragma unroll
      for (int h = 0; h < F4; ++h) {
        const int col = c * F4 + h, D4 = DV * F4;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
        for (long long q = first; q < first + count; ++q) {
          float4 v = partial[q * D4 + col];
          a.x += v.x; a.y += v.y; a.z += v.z; a.w += v.w;
        }
        a.x *= f; a.y *= f; a.z *= f; a.w *= f;
        if (diag) {
          a.x = fmaf(d, xv[h].x, a.x); a.y = fmaf(d, xv[h].y, a.y);
          a.z = fmaf(d, xv[h].z, a.z); a.w = fmaf(d, xv[h].w, a.w);
        }
        if (add) {
          MGG_CSR_STORE_IF(a) add_to_row(out + t * D4 + col, a);
        } else {
          MGG_CSR_STORE_IF(a) out[t * D4 + col] = a;
        }
      }
    }
  }
}

}  // namespace

#define DEF_ROWS_S(S, SFX, L, V, W)                                                                      \
  extern "C" __global__ void mgg_csr_rows##SFX##_l##L##_v##V##_w##W(                                   \
      long long n_long, const long long* long_tasks, long long n_items, const void* items, int runs,   \
      const long long* indptr, const int* src, const float* wt, const float* cf, const float* rf,      \
      const float* diag, const Store<S>::vec* x, int DV, float4* out, float4* partial, int add) {       \
    csr_rows_body<S, L, V, W>(n_long, long_tasks, n_items, items, runs, indptr, src, wt, cf, rf, diag, x, \
                              DV, out, partial, add);                                                   \
  }
#define DEF_ROWS(L, V, W) MGG_CSR_FP32(DEF_ROWS_S(0, , L, V, W)) MGG_CSR_BF16(DEF_ROWS_S(1, _bf16, L, V, W)) \
  MGG_CSR_FP16(DEF_ROWS_S(2, _fp16, L, V, W))
#define DEF_ROWS_W(L, V) MGG_CSR_W0(DEF_ROWS(L, V, 0)) MGG_CSR_W1(DEF_ROWS(L, V, 1)) MGG_CSR_W2(DEF_ROWS(L, V, 2))
MGG_CSR_REST(DEF_ROWS_W(1, 1) DEF_ROWS_W(2, 1) DEF_ROWS_W(4, 1) DEF_ROWS_W(8, 1) DEF_ROWS_W(16, 1))
MGG_CSR_ROWS32(DEF_ROWS_W(32, 1) DEF_ROWS_W(32, 2) DEF_ROWS_W(32, 4))

// The scan mapping (float32, bf16, fp16 storage): block = 32 * SCAN_WPB threads, grid = ceil((n_long + n_runs) /
// SCAN_WPB); at most 72 registers (7 blocks an SM; the bound keeps ptxas from the 79-102 it
// otherwise takes).
#define DEF_SCAN(S, SFX, L, W)                                                                           \
  extern "C" __global__ void __launch_bounds__(32 * SCAN_WPB, 7) mgg_csr_scan##SFX##_l##L##_w##W(        \
      long long n_long, const long long* long_tasks, long long n_runs, const long long* runs,           \
      const long long* indptr, const int* src, const float* wt, const float* cf, const float* rf,       \
      const float* diag, const void* x, int DV, float4* out, float4* partial, int add,                  \
      const long long* ends_rf, long long dlo, long long dhi, int self_rf) {                            \
    csr_scan_body<L, W, S>(n_long, long_tasks, n_runs, runs, indptr, src, wt, cf, rf, diag, x, DV, out,  \
                           partial, add, ends_rf, dlo, dhi, self_rf);                                    \
  }
// 16-bit storage: w = 1 (sum, mean, a producer-scaled gcn table) and per-edge weights (its column
// kinds read the plan's weights: CsrRowsExecutor.column_by_weights), no cf[src] form
#define DEF_SCAN_W(L)                                                                                     \
  MGG_CSR_FP32(MGG_CSR_W0(DEF_SCAN(0, , L, 0)) MGG_CSR_W1(DEF_SCAN(0, , L, 1)) MGG_CSR_W2(DEF_SCAN(0, , L, 2))) \
  MGG_CSR_BF16(MGG_CSR_W0(DEF_SCAN(1, _bf16, L, 0)) MGG_CSR_W1(DEF_SCAN(1, _bf16, L, 1)))                   \
  MGG_CSR_FP16(MGG_CSR_W0(DEF_SCAN(2, _fp16, L, 0)) MGG_CSR_W1(DEF_SCAN(2, _fp16, L, 1)))
MGG_CSR_REST(DEF_SCAN_W(2) DEF_SCAN_W(4) DEF_SCAN_W(8))

// Second pass for hub rows split over several warps: split int64 [n_split, 3] = (row, first
// partial slot, number of slots); out[row] = rf[row] * sum(partials) + diag[row] * x[row], the
// self term only where dlo <= row < dhi (a source segment's pass adds it to the rows of its range).
#define DEF_COMBINE(S, SFX)                                                                              \
  extern "C" __global__ void mgg_csr_combine##SFX(long long n_split, const long long* split,           \
                                                  const float4* partial, const float* rf,               \
                                                  const float* diag, const Store<S>::vec* x, int DV,   \
                                                  float4* out, int add, long long dlo, long long dhi) { \
    csr_combine_body<S>(n_split, split, partial, rf, diag, x, DV, out, add, dlo, dhi);                  \
  }
MGG_CSR_REST(MGG_CSR_W0(MGG_CSR_FP32(DEF_COMBINE(0, )) MGG_CSR_BF16(DEF_COMBINE(1, _bf16)) MGG_CSR_FP16(DEF_COMBINE(2, _fp16))))

// The gcn pre-scale of float32 storage (mgg/kernels/csr_rows/, CsrRowsExecutor): out[i] =
// cf[row] * x[i] for n rows of DV float4s. Block b covers float4s [b * 4 * blockDim, (b + 1) * 4 *
// blockDim): each thread loads its SCALE_UNROLL float4s (blockDim apart, coalesced) before it
// stores any; grid = ceil(n * DV / (SCALE_UNROLL * blockDim)), no grid-stride loop. The row of a
// float4 is i >> shift when DV is a power of two (shift >= 0), else i / DV. Stores are plain, so
// the part of out that stays in L2 serves the gather that follows. One H200 (bench/results/
// 2026-11-26-h200x1-ac5feba, c3): 0.088 ms for [2.45M, 16] against 0.084 for a
// copy, where a grid-stride loop took 0.093-0.097 and torch's broadcast multiply 0.128.
#define SCALE_UNROLL 4
#if MGG_CSR_HAS(0) && MGG_CSR_HAS_W(0) && MGG_CSR_HAS_REST
extern "C" __global__ void mgg_csr_scale_rows(long long n, int DV, int shift, const float* __restrict__ cf,
                                              const float4* __restrict__ x, float4* __restrict__ out) {
  const long long total = n * DV;
  const long long base = (long long)blockIdx.x * blockDim.x * SCALE_UNROLL + threadIdx.x;
  float4 v[SCALE_UNROLL];
  float f[SCALE_UNROLL];
#pragma unroll
  for (int u = 0; u < SCALE_UNROLL; ++u) {
    const long long i = base + (long long)u * blockDim.x;
    if (i < total) {
      f[u] = __ldg(cf + (shift >= 0 ? i >> shift : i / DV));
      v[u] = __ldg(x + i);
    }
  }
#pragma unroll
  for (int u = 0; u < SCALE_UNROLL; ++u) {
    const long long i = base + (long long)u * blockDim.x;
    if (i < total) out[i] = make_float4(v[u].x * f[u], v[u].y * f[u], v[u].z * f[u], v[u].w * f[u]);
  }
}
#endif

// The 16-bit table of a P = 1 call (mgg/kernels/csr_rows/, CsrRowsExecutor._table): out row r
// = round16(s[r] * x[r]) (s = cf, the gcn factor's scaled forms; null: x as given), padded with
// zeros to DV 16-byte vectors of 8 values; x is float32 [n, D] with rows of D floats (vec4: D % 4
// == 0 and x 16-byte aligned, so a vector's 8 values are two float4 loads). Rounding is to nearest
// even, as torch's casts. One thread a vector, TABLE16_UNROLL vectors a thread (blockDim apart,
// loaded before any is stored); grid = ceil(n * DV / (TABLE16_UNROLL * blockDim)). It replaces a
// zero fill plus torch's copy (the plain table) or plus its broadcast multiply into a 16-bit
// view, which runs unvectorised (products-like [2.45M, 16]: 0.16 ms a call, one H200).
#define TABLE16_UNROLL 4
namespace {
template <int S> __device__ __forceinline__ unsigned pack2(float a, float b);
template <> __device__ __forceinline__ unsigned pack2<1>(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const unsigned*>(&h);
}
template <> __device__ __forceinline__ unsigned pack2<2>(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const unsigned*>(&h);
}
template <int S>
__device__ __forceinline__ void table16_body(long long n, int D, int DV, int vec4, const float* __restrict__ s,
                                             const float* __restrict__ x, uint4* __restrict__ out) {
  const long long total = n * DV;
  const long long base = (long long)blockIdx.x * blockDim.x * TABLE16_UNROLL + threadIdx.x;
  float v[TABLE16_UNROLL][8];
#pragma unroll
  for (int u = 0; u < TABLE16_UNROLL; ++u) {
    const long long i = base + (long long)u * blockDim.x;
#pragma unroll
    for (int k = 0; k < 8; ++k) v[u][k] = 0.f;
    if (i < total) {
      const long long r = i / DV;
      const int c0 = (int)(i - r * DV) * 8;
      const float* __restrict__ row = x + r * D;
      if (vec4 && c0 + 8 <= D) {
        const float4 a = __ldcs(reinterpret_cast<const float4*>(row + c0));
        const float4 b = __ldcs(reinterpret_cast<const float4*>(row + c0 + 4));
        v[u][0] = a.x; v[u][1] = a.y; v[u][2] = a.z; v[u][3] = a.w;
        v[u][4] = b.x; v[u][5] = b.y; v[u][6] = b.z; v[u][7] = b.w;
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k)
          if (c0 + k < D) v[u][k] = __ldcs(row + c0 + k);
      }
      if (s) {
        const float f = __ldg(s + r);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[u][k] *= f;
      }
    }
  }
#pragma unroll
  for (int u = 0; u < TABLE16_UNROLL; ++u) {
    const long long i = base + (long long)u * blockDim.x;
    if (i < total)
      out[i] = make_uint4(pack2<S>(v[u][0], v[u][1]), pack2<S>(v[u][2], v[u][3]), pack2<S>(v[u][4], v[u][5]),
                          pack2<S>(v[u][6], v[u][7]));
  }
}
}  // namespace
#define DEF_TABLE16(S, SFX)                                                                           \
  extern "C" __global__ void mgg_csr_table16##SFX(long long n, int D, int DV, int vec4, const float* s, \
                                                  const float* x, uint4* out) {                        \
    table16_body<S>(n, D, DV, vec4, s, x, out);                                                        \
  }
MGG_CSR_REST(MGG_CSR_W0(MGG_CSR_BF16(DEF_TABLE16(1, _bf16)) MGG_CSR_FP16(DEF_TABLE16(2, _fp16))))
