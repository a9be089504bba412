// Fused GAT / mean aggregation kernels over an NVSHMEM symmetric table (mgg GAT, GPU path).
// Tested on H100/H200 against the float64 dense reference (tests/nn/test_gat_gpu.py, P = 1 and 2).
//
// Table: every PE publishes its rows [n_local, W] in one symmetric array `sym` (row stride W):
//   additive: W = H*C + H   row = [Wh (H*C) | a_src.Wh (H)]
//   dot:      W = H*C       row = [Wh]
//   mean:     W = C (H = 1) row = [x]
// Per target i and head h (z = score, e = logit, keep = attention-dropout scale):
//   additive: z = dst[i,h] + src[j,h], e = LeakyReLU(z); dot: e = z = (Wh_i.Wh_j)_h / sqrt(C)
//   alpha_ij = exp(e_ij - m_i) / l_i,  out_i = sum_j alpha_ij keep_ij Wh_j
// The forward keeps a running (m, l, acc) per head (online softmax, FlashAttention-style
// rescaling: m' = max(m, e); acc = acc * exp(m - m') + exp(e - m') * keep * Wh_j), so scores,
// softmax and the weighted sum are ONE pass with no E x heads x C intermediate; it saves only
// (m, l) per target and head. The backward recomputes alpha from (m, l):
//   c_i = g_i . out_i (per head, computed by the launcher),  t_ij = keep_ij g_i . Wh_j,
//   dz_ij = alpha_ij (t_ij - c_i) * (z > 0 ? 1 : slope)      (dot: no LeakyReLU factor)
//   dWh_j += alpha_ij keep_ij g_i, d(src)_j += dz_ij, d(dst)_i += dz_ij      (additive)
//   dWh_j += dz_ij Wh_i / sqrt(C), dWh_i += dz_ij Wh_j / sqrt(C)              (dot)
// Source-side gradients are atomicAdds into grad_local [n, W] (local sources) or grad_halo
// [H_halo, W] (remote sources, by halo slot); the launcher then sums grad_halo at the owners
// (mgg.graph.halo.scatter_halo_add).
//
// Two abstractions (fuseGNN; chosen by mgg.graph.adaptive from the plan's degrees):
//   node-centric (gat_fwd_node / gat_bwd_node): one warp per target, lanes over the H*C columns;
//     the target's remote neighbors are read partition by partition (<= ps rows) with
//     nvshmemx_float_get_nbi_warp into the warp's shared-memory buffer; the gets of the first
//     remote partition are issued before the local neighbors are processed and completed with
//     nvshmem_quiet() after them (MGG's interleaving of remote loads with local aggregation).
//   edge-centric (gat_fwd_edge / gat_bwd_edge): each warp owns EPW consecutive edges of the
//     target-sorted edge list (remote rows first fetched once into a halo buffer by
//     gat_gather_halo); runs of one target are reduced online; a target split over warps leaves
//     partial (m, l, acc) states in slots 2w (run at the warp's range start) / 2w+1 (at its end),
//     merged by gat_merge_partials (O(#split targets) work).
// Attention dropout: keep = (hash(seed, edge id, h) >= p) / (1 - p), recomputed in the backward.
//
// Build (mgg/graph/gat_gpu.py does this, cached by source hash):
//   nvcc -arch=sm_90 -rdc=true -std=c++17 -I$NVSHMEM/include -c gat_fused.cu -o k.o
//   nvcc -arch=sm_90 -dlink -cubin k.o $NVSHMEM/lib/libnvshmem_device.a -o k.cubin
// NVSHMEM's device API: the defines that nvshmem.h and nvshmemx.h include, without their host
// API, collectives and tile API, whose parsing took 2 s of each NVSHMEM source's compile (sm_90,
// nvcc 13.0, NVSHMEM 3.4.5; the linked cubin's code is the same); the two public headers where
// an NVSHMEM lays its headers out otherwise
#if __has_include(<non_abi/nvshmem_build_options.h>) && __has_include(<device/nvshmem_defines.h>) && \
    __has_include(<device/nvshmemx_defines.h>)
#include <non_abi/nvshmem_build_options.h>
#include <device/nvshmem_defines.h>
#include <device/nvshmemx_defines.h>
#else
#include <nvshmem.h>
#include <nvshmemx.h>
#endif
#include <math_constants.h>

#define MGG_KMAX 8    // columns per lane: H*C <= 32 * MGG_KMAX = 256
#define MGG_MAXH 16   // heads
#define MODE_ADDITIVE 0
#define MODE_DOT 1
#define MODE_MEAN 2

struct GatArgs {
  int n_local, H, C, W, mode, add_self_loops, ps;
  float slope, inv_sqrt_c, dropout;
  unsigned long long seed;
};

// kernel parameters are plain scalars (launchers pass numpy scalars); each kernel packs them
#define GAT_ARGS_PARAMS int n_local, int H, int C, int W, int mode, int add_self_loops, int ps, \
    float slope, float inv_sqrt_c, float dropout, unsigned long long seed
#define GAT_ARGS_INIT const GatArgs a = {n_local, H, C, W, mode, add_self_loops, ps, slope, inv_sqrt_c, dropout, seed}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float keep_scale(const GatArgs& a, long long edge, int h) {
  if (a.dropout <= 0.f) return 1.f;
  unsigned long long x = a.seed ^ ((unsigned long long)edge * 0x9E3779B97F4A7C15ull) ^ ((unsigned long long)(h + 1) << 56);
  x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ull; x ^= x >> 27; x *= 0x94D049BB133111EBull; x ^= x >> 31;
  const float u = (float)(x >> 40) * (1.0f / 16777216.0f);
  return u >= a.dropout ? 1.f / (1.f - a.dropout) : 0.f;
}

// Per-edge logits e[h] (all lanes get all heads). row_j: the source row (W floats), row_i:
// the target's row (dot), dst_i: [H] target scores (additive). z[h] keeps the pre-activation.
__device__ __forceinline__ void edge_scores(const GatArgs& a, const float* row_j, const float* row_i,
                                            const float* dst_i, int lane, float* z, float* e) {
  if (a.mode == MODE_ADDITIVE) {
    for (int h = 0; h < a.H; ++h) {
      z[h] = dst_i[h] + row_j[a.H * a.C + h];
      e[h] = z[h] > 0.f ? z[h] : z[h] * a.slope;
    }
  } else {  // dot
    for (int h = 0; h < a.H; ++h) {
      float p = 0.f;
      for (int c = lane; c < a.C; c += 32) p += row_i[h * a.C + c] * row_j[h * a.C + c];
      z[h] = e[h] = warp_sum(p) * a.inv_sqrt_c;
    }
  }
}

// online-softmax state of one warp (one target), lanes over columns f = lane + 32 k
struct OnlineState {
  float m[MGG_MAXH], l[MGG_MAXH], acc[MGG_KMAX];
};

__device__ __forceinline__ void state_init(OnlineState& s, const GatArgs& a) {
  for (int h = 0; h < a.H; ++h) { s.m[h] = -CUDART_INF_F; s.l[h] = 0.f; }
#pragma unroll
  for (int k = 0; k < MGG_KMAX; ++k) s.acc[k] = 0.f;
}

__device__ __forceinline__ void state_add(OnlineState& s, const GatArgs& a, const float* row_j,
                                          const float* row_i, const float* dst_i, long long edge,
                                          float mean_w, int lane) {
  const int HC = a.H * a.C;
  if (a.mode == MODE_MEAN) {
#pragma unroll
    for (int k = 0; k < MGG_KMAX; ++k) {
      const int f = lane + 32 * k;
      if (f < HC) s.acc[k] += mean_w * row_j[f];
    }
    return;
  }
  float z[MGG_MAXH], e[MGG_MAXH], scale[MGG_MAXH], p[MGG_MAXH];
  edge_scores(a, row_j, row_i, dst_i, lane, z, e);
  for (int h = 0; h < a.H; ++h) {
    const float mn = fmaxf(s.m[h], e[h]);
    scale[h] = __expf(s.m[h] - mn);  // exp(-inf) = 0 on the first edge
    p[h] = __expf(e[h] - mn);
    s.l[h] = s.l[h] * scale[h] + p[h];
    s.m[h] = mn;
    p[h] *= keep_scale(a, edge, h);
  }
#pragma unroll
  for (int k = 0; k < MGG_KMAX; ++k) {
    const int f = lane + 32 * k;
    if (f < HC) {
      const int h = f / a.C;
      s.acc[k] = s.acc[k] * scale[h] + p[h] * row_j[f];
    }
  }
}

__device__ __forceinline__ void state_store(const OnlineState& s, const GatArgs& a, long long i,
                                            float* out, float* m_out, float* l_out, int lane) {
  const int HC = a.H * a.C;
#pragma unroll
  for (int k = 0; k < MGG_KMAX; ++k) {
    const int f = lane + 32 * k;
    if (f < HC) {
      const float l = (a.mode == MODE_MEAN) ? 1.f : s.l[f / a.C];
      out[i * HC + f] = l > 0.f ? s.acc[k] / l : 0.f;
    }
  }
  if (lane == 0 && a.mode != MODE_MEAN) {
    for (int h = 0; h < a.H; ++h) { m_out[i * a.H + h] = s.m[h]; l_out[i * a.H + h] = s.l[h]; }
  }
}

// Visit every neighbor of target i, for one warp. Remote rows come partition by partition (<= ps
// rows) through nvshmemx_float_get_nbi_warp into the warp's buffer `buf` [ps, W]; the first
// partition's gets are issued before the local neighbors (and the self loop) are visited and
// completed by nvshmem_quiet() after them. visit(row_j, edge id, source): source = j >= 0 for a
// local row (the self loop: i), -1 - k for remote edge k. The graph's own self loops are skipped
// when add_self_loops (replaced by one, edge id El + Er + i).
template <class Visit>
__device__ __forceinline__ void for_each_neighbor(const GatArgs& a, const float* sym, float* buf,
                                                  const long long* l_ptr, const long long* l_idx,
                                                  const long long* r_ptr, const int* r_pe,
                                                  const long long* r_row, long long i, long long El,
                                                  long long Er, Visit visit) {
  const long long re = r_ptr[i + 1];
  long long pb = r_ptr[i], pe_ = min(pb + (long long)a.ps, re);
  for (long long k = pb; k < pe_; ++k)
    nvshmemx_float_get_nbi_warp(buf + (k - pb) * a.W, sym + r_row[k] * a.W, (size_t)a.W, r_pe[k]);
  for (long long k = l_ptr[i]; k < l_ptr[i + 1]; ++k) {
    const long long j = l_idx[k];
    if (a.add_self_loops && j == i) continue;
    visit(sym + j * a.W, k, j);
  }
  if (a.add_self_loops) visit(sym + i * a.W, El + Er + i, i);
  while (pb < re) {
    nvshmem_quiet();
    __syncwarp();
    for (long long k = pb; k < pe_; ++k) visit(buf + (k - pb) * a.W, El + k, -1 - k);
    __syncwarp();
    pb = pe_;
    pe_ = min(pb + (long long)a.ps, re);
    for (long long k = pb; k < pe_; ++k)
      nvshmemx_float_get_nbi_warp(buf + (k - pb) * a.W, sym + r_row[k] * a.W, (size_t)a.W, r_pe[k]);
  }
}

// ---------------------------------------------------------------------------------------------
// node-centric forward: one warp per target; dynamic smem = warps_per_block * ps * W floats
extern "C" __global__ void gat_fwd_node(GAT_ARGS_PARAMS, const float* sym, const float* __restrict__ dst,
                                        const long long* __restrict__ l_ptr, const long long* __restrict__ l_idx,
                                        const long long* __restrict__ r_ptr, const int* __restrict__ r_pe,
                                        const long long* __restrict__ r_row, const float* __restrict__ mean_w,
                                        float* __restrict__ out, float* __restrict__ m_out, float* __restrict__ l_out) {
  GAT_ARGS_INIT;
  extern __shared__ float smem[];
  const int lane = threadIdx.x & 31;
  float* buf = smem + (size_t)(threadIdx.x >> 5) * a.ps * a.W;
  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
  const long long El = l_ptr[a.n_local];
  const long long Er = r_ptr[a.n_local];
  for (long long i = warp; i < a.n_local; i += n_warps) {
    OnlineState s;
    state_init(s, a);
    const float* row_i = sym + i * a.W;
    const float* dst_i = dst + i * a.H;
    const float mw = (a.mode == MODE_MEAN) ? mean_w[i] : 0.f;
    for_each_neighbor(a, sym, buf, l_ptr, l_idx, r_ptr, r_pe, r_row, i, El, Er,
                      [&](const float* row_j, long long edge, long long) {
                        state_add(s, a, row_j, row_i, dst_i, edge, mw, lane);
                      });
    state_store(s, a, i, out, m_out, l_out, lane);
  }
}

// One edge of the backward, for target i (row_i, g_i, c_i, dst_i) and source row_j; gradients of
// the source go to grad_j (W floats, atomics); target-side ones accumulate in gdst / gq (registers).
__device__ __forceinline__ void bwd_edge(const GatArgs& a, const float* row_j, const float* row_i,
                                         const float* dst_i, const float* g_i, const float* c_i,
                                         const float* m_i, const float* l_i, long long edge, float mean_w,
                                         float* grad_j, float* gdst, float* gq, int lane) {
  const int HC = a.H * a.C;
  if (a.mode == MODE_MEAN) {
    for (int f = lane; f < HC; f += 32) atomicAdd(grad_j + f, mean_w * g_i[f]);
    return;
  }
  float z[MGG_MAXH], e[MGG_MAXH];
  edge_scores(a, row_j, row_i, dst_i, lane, z, e);
  for (int h = 0; h < a.H; ++h) {
    const float alpha = __expf(e[h] - m_i[h]) / l_i[h];
    const float keep = keep_scale(a, edge, h);
    float t = 0.f;
    for (int c = lane; c < a.C; c += 32) {
      const int f = h * a.C + c;
      t += g_i[f] * row_j[f];
      atomicAdd(grad_j + f, alpha * keep * g_i[f]);
    }
    t = warp_sum(t) * keep;
    float dz = alpha * (t - c_i[h]);
    if (a.mode == MODE_ADDITIVE) {
      if (z[h] <= 0.f) dz *= a.slope;
      if (lane == 0) atomicAdd(grad_j + HC + h, dz);
      gdst[h] += dz;
    } else {  // dot: z = (Wh_i . Wh_j) / sqrt(C)
      const float d = dz * a.inv_sqrt_c;
#pragma unroll
      for (int k = 0; k < MGG_KMAX; ++k) {
        const int f = lane + 32 * k;
        if (f < HC && f / a.C == h) gq[k] += d * row_j[f];
      }
      for (int c = lane; c < a.C; c += 32) atomicAdd(grad_j + h * a.C + c, d * row_i[h * a.C + c]);
    }
  }
}

// node-centric backward: one warp per target. grad_local [n, W], grad_halo [H_halo, W] (by slot),
// grad_dst [n, H] (additive) or grad_q [n, H*C] (dot; added to grad_local's Wh part by the launcher).
extern "C" __global__ void gat_bwd_node(GAT_ARGS_PARAMS, const float* sym, const float* __restrict__ dst,
                                        const long long* __restrict__ l_ptr, const long long* __restrict__ l_idx,
                                        const long long* __restrict__ r_ptr, const int* __restrict__ r_pe,
                                        const long long* __restrict__ r_row, const long long* __restrict__ r_slot,
                                        const float* __restrict__ mean_w, const float* __restrict__ g,
                                        const float* __restrict__ c, const float* __restrict__ m,
                                        const float* __restrict__ l, float* grad_local, float* grad_halo,
                                        float* __restrict__ grad_dst) {
  GAT_ARGS_INIT;
  extern __shared__ float smem[];
  const int lane = threadIdx.x & 31;
  float* buf = smem + (size_t)(threadIdx.x >> 5) * a.ps * a.W;
  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
  const long long El = l_ptr[a.n_local];
  const long long Er = r_ptr[a.n_local];
  const int HC = a.H * a.C;
  for (long long i = warp; i < a.n_local; i += n_warps) {
    float gdst[MGG_MAXH], gq[MGG_KMAX];
    for (int h = 0; h < a.H; ++h) gdst[h] = 0.f;
#pragma unroll
    for (int k = 0; k < MGG_KMAX; ++k) gq[k] = 0.f;
    const float* row_i = sym + i * a.W;
    const float* dst_i = dst + i * a.H;
    const float* g_i = g + i * HC;
    const float* c_i = c + i * a.H;
    const float* m_i = m + i * a.H;
    const float* l_i = l + i * a.H;
    const float mw = (a.mode == MODE_MEAN) ? mean_w[i] : 0.f;
    for_each_neighbor(a, sym, buf, l_ptr, l_idx, r_ptr, r_pe, r_row, i, El, Er,
                      [&](const float* row_j, long long edge, long long source) {
                        float* grad_j = source >= 0 ? grad_local + source * a.W
                                                    : grad_halo + r_slot[-1 - source] * a.W;
                        bwd_edge(a, row_j, row_i, dst_i, g_i, c_i, m_i, l_i, edge, mw, grad_j, gdst, gq, lane);
                      });
    if (a.mode == MODE_ADDITIVE) {
      if (lane == 0) for (int h = 0; h < a.H; ++h) grad_dst[i * a.H + h] += gdst[h];
    } else if (a.mode == MODE_DOT) {
#pragma unroll
      for (int k = 0; k < MGG_KMAX; ++k) {
        const int f = lane + 32 * k;
        if (f < HC) grad_dst[i * HC + f] += gq[k];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// edge-centric path. Edge list sorted by target: e_tgt [E], e_src [E] (< n_local: local row,
// >= n_local: halo row e_src - n_local), e_id [E] (dropout id, same numbering as the node path).

// one warp per halo row: copy row halo_row[h] of PE halo_pe[h] into halo[h] (W floats)
extern "C" __global__ void gat_gather_halo(const float* sym, const int* __restrict__ halo_pe,
                                           const long long* __restrict__ halo_row, long long n_halo, int W,
                                           float* __restrict__ halo) {
  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
  for (long long h = warp; h < n_halo; h += n_warps)
    nvshmemx_float_get_warp(halo + h * W, sym + halo_row[h] * W, (size_t)W, halo_pe[h]);
}

__device__ __forceinline__ const float* edge_row(const GatArgs& a, const float* local, const float* halo, long long s) {
  return s < a.n_local ? local + s * a.W : halo + (s - a.n_local) * a.W;
}

// Column-per-lane form of the additive edge path (`cols_ok`): lane owns columns f = lane + 32 k
// (k < KK, KK = ceil(H*C / 32) a template constant) and keeps the online-softmax state of f's
// head h = f / C per column, in registers: every lane computes only its own heads' scores and
// exps, no array is indexed by a runtime head, and the backward's per-head dot product g_i . Wh_j
// is a shuffle sum over the C lanes of a head (C dividing 32) or over the warp (H = 1). The
// general per-head loops above remain for dot attention, mean, and other (H, C).
__device__ __forceinline__ bool cols_ok(const GatArgs& a) {
  return a.mode == MODE_ADDITIVE && a.H * a.C <= 32 * MGG_KMAX && (a.H == 1 || (a.C <= 32 && 32 % a.C == 0));
}

template <int KK>
__device__ __forceinline__ void fwd_run_cols(const GatArgs& a, const float* local, const float* halo,
                                             const float* __restrict__ dst, const long long* __restrict__ e_src,
                                             const long long* __restrict__ e_id, long long k, long long run_end,
                                             long long i, bool whole, long long warp, bool first,
                                             float* __restrict__ out, float* __restrict__ m_out,
                                             float* __restrict__ l_out, float* __restrict__ partial, int lane) {
  const int HC = a.H * a.C;
  int f[KK], h[KK];
  bool on[KK];
  float d[KK], m[KK], l[KK], acc[KK];
#pragma unroll
  for (int kk = 0; kk < KK; ++kk) {
    f[kk] = lane + 32 * kk;
    on[kk] = f[kk] < HC;
    h[kk] = on[kk] ? f[kk] / a.C : 0;
    d[kk] = on[kk] ? dst[i * a.H + h[kk]] : 0.f;
    m[kk] = -CUDART_INF_F;
    l[kk] = 0.f;
    acc[kk] = 0.f;
  }
  for (long long q = k; q < run_end; ++q) {
    const float* row = edge_row(a, local, halo, e_src[q]);
    float sc[KK], v[KK];
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) {  // the loads first: all of the edge's columns in flight
      sc[kk] = on[kk] ? row[HC + h[kk]] : 0.f;
      v[kk] = on[kk] ? row[f[kk]] : 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) {
      if (!on[kk]) continue;
      const float z = d[kk] + sc[kk];
      const float e = z > 0.f ? z : z * a.slope;
      const float mn = fmaxf(m[kk], e);
      const float scale = __expf(m[kk] - mn);  // exp(-inf) = 0 on the first edge
      float p = __expf(e - mn);
      l[kk] = l[kk] * scale + p;
      m[kk] = mn;
      if (a.dropout > 0.f) p *= keep_scale(a, e_id[q], h[kk]);
      acc[kk] = acc[kk] * scale + p * v[kk];
    }
  }
  if (whole) {
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) {
      if (!on[kk]) continue;
      out[i * HC + f[kk]] = l[kk] > 0.f ? acc[kk] / l[kk] : 0.f;
      if (f[kk] % a.C == 0) { m_out[i * a.H + h[kk]] = m[kk]; l_out[i * a.H + h[kk]] = l[kk]; }
    }
  } else {
    float* slot = partial + (2 * warp + (first ? 0 : 1)) * (1 + 2 * a.H + HC);
    if (lane == 0) slot[0] = __int_as_float((int)i);
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) {
      if (!on[kk]) continue;
      slot[1 + 2 * a.H + f[kk]] = acc[kk];
      if (f[kk] % a.C == 0) { slot[1 + h[kk]] = m[kk]; slot[1 + a.H + h[kk]] = l[kk]; }
    }
  }
}

// One target's run [k, ...) of the backward in the column-per-lane form; returns the run's end.
template <int KK>
__device__ __forceinline__ long long bwd_run_cols(const GatArgs& a, const float* local, const float* halo,
                                                  const float* __restrict__ dst, const long long* __restrict__ e_tgt,
                                                  const long long* __restrict__ e_src, const long long* __restrict__ e_id,
                                                  long long k, long long end, long long i,
                                                  const float* __restrict__ g, const float* __restrict__ c,
                                                  const float* __restrict__ m, const float* __restrict__ l,
                                                  float* grad_local, float* grad_halo, float* grad_dst, int lane) {
  const int HC = a.H * a.C;
  int f[KK], h[KK];
  bool on[KK], lead[KK];
  float d[KK], gi[KK], ci[KK], mi[KK], li[KK], gd[KK];
#pragma unroll
  for (int kk = 0; kk < KK; ++kk) {
    f[kk] = lane + 32 * kk;
    on[kk] = f[kk] < HC;
    h[kk] = on[kk] ? f[kk] / a.C : 0;
    lead[kk] = on[kk] && f[kk] % a.C == 0;  // the lane that carries head h's scalar gradients
    const long long ih = i * a.H + h[kk];
    d[kk] = on[kk] ? dst[ih] : 0.f;
    gi[kk] = on[kk] ? g[i * HC + f[kk]] : 0.f;
    ci[kk] = on[kk] ? c[ih] : 0.f;
    mi[kk] = on[kk] ? m[ih] : 0.f;
    li[kk] = on[kk] ? l[ih] : 1.f;
    gd[kk] = 0.f;
  }
  long long q = k;
  for (; q < end && e_tgt[q] == i; ++q) {
    const long long s = e_src[q];
    const float* row = edge_row(a, local, halo, s);
    float* grad_j = s < a.n_local ? grad_local + s * a.W : grad_halo + (s - a.n_local) * a.W;
    float sc[KK], t[KK];
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) {
      sc[kk] = on[kk] ? row[HC + h[kk]] : 0.f;
      t[kk] = on[kk] ? gi[kk] * row[f[kk]] : 0.f;
    }
    if (a.H == 1) {  // one head: the whole warp's columns
      float sum = 0.f;
#pragma unroll
      for (int kk = 0; kk < KK; ++kk) sum += t[kk];
      sum = warp_sum(sum);
#pragma unroll
      for (int kk = 0; kk < KK; ++kk) t[kk] = sum;
    } else {          // C divides 32: a head is C consecutive lanes of one column slot
#pragma unroll
      for (int kk = 0; kk < KK; ++kk)
        for (int o = a.C >> 1; o > 0; o >>= 1) t[kk] += __shfl_xor_sync(0xffffffffu, t[kk], o);
    }
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) {
      if (!on[kk]) continue;
      const float z = d[kk] + sc[kk];
      const float e = z > 0.f ? z : z * a.slope;
      const float alpha = __expf(e - mi[kk]) / li[kk];
      const float keep = a.dropout > 0.f ? keep_scale(a, e_id[q], h[kk]) : 1.f;
      float dz = alpha * (t[kk] * keep - ci[kk]);
      if (z <= 0.f) dz *= a.slope;
      atomicAdd(grad_j + f[kk], alpha * keep * gi[kk]);
      if (lead[kk]) {
        atomicAdd(grad_j + HC + h[kk], dz);
        gd[kk] += dz;
      }
    }
  }
#pragma unroll
  for (int kk = 0; kk < KK; ++kk)
    if (lead[kk]) atomicAdd(grad_dst + i * a.H + h[kk], gd[kk]);
  return q;
}

// partial state slot: tgt, m[H], l[H], acc[H*C] -> stride 1 + 2H + HC floats (tgt stored as float bits)
extern "C" __global__ void gat_fwd_edge(GAT_ARGS_PARAMS, const float* local, const float* halo, const float* __restrict__ dst,
                                        const long long* __restrict__ e_tgt, const long long* __restrict__ e_src,
                                        const long long* __restrict__ e_id, const long long* __restrict__ t_ptr,
                                        long long E, int epw, const float* __restrict__ mean_w,
                                        float* __restrict__ out, float* __restrict__ m_out, float* __restrict__ l_out,
                                        float* __restrict__ partial) {
  GAT_ARGS_INIT;
  const int lane = threadIdx.x & 31;
  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const long long b = warp * epw;
  if (b >= E) return;
  const long long end = min(b + (long long)epw, E);
  const int HC = a.H * a.C, stride = 1 + 2 * a.H + HC;
  long long k = b;
  const int kk_cols = cols_ok(a) ? (HC + 31) / 32 : 0;  // 0: the general per-head path
  while (k < end) {
    const long long i = e_tgt[k];
    const long long run_end = min(t_ptr[i + 1], end);
    if (kk_cols) {
      const bool whole = (k == t_ptr[i]) && (run_end == t_ptr[i + 1]);
      switch (kk_cols) {
        case 1: fwd_run_cols<1>(a, local, halo, dst, e_src, e_id, k, run_end, i, whole, warp, k == b, out, m_out, l_out, partial, lane); break;
        case 2: fwd_run_cols<2>(a, local, halo, dst, e_src, e_id, k, run_end, i, whole, warp, k == b, out, m_out, l_out, partial, lane); break;
        case 3: case 4: fwd_run_cols<4>(a, local, halo, dst, e_src, e_id, k, run_end, i, whole, warp, k == b, out, m_out, l_out, partial, lane); break;
        default: fwd_run_cols<8>(a, local, halo, dst, e_src, e_id, k, run_end, i, whole, warp, k == b, out, m_out, l_out, partial, lane); break;
      }
      k = run_end;
      continue;
    }
    OnlineState s;
    state_init(s, a);
    const float* row_i = local + i * a.W;
    const float mw = (a.mode == MODE_MEAN) ? mean_w[i] : 0.f;
    for (long long q = k; q < run_end; ++q)
      state_add(s, a, edge_row(a, local, halo, e_src[q]), row_i, dst + i * a.H, e_id[q], mw, lane);
    const bool whole = (k == t_ptr[i]) && (run_end == t_ptr[i + 1]);
    if (whole) {
      state_store(s, a, i, out, m_out, l_out, lane);
    } else {
      float* slot = partial + (2 * warp + (k == b ? 0 : 1)) * stride;
      if (lane == 0) {
        slot[0] = __int_as_float((int)i);
        for (int h = 0; h < a.H; ++h) { slot[1 + h] = s.m[h]; slot[1 + a.H + h] = s.l[h]; }
      }
#pragma unroll
      for (int kk = 0; kk < MGG_KMAX; ++kk) {
        const int f = lane + 32 * kk;
        if (f < HC) slot[1 + 2 * a.H + f] = s.acc[kk];
      }
    }
    k = run_end;
  }
}

// one warp per split target: merge its partial states (slots slot_ids[slot_ptr[t]..slot_ptr[t+1]])
extern "C" __global__ void gat_merge_partials(GAT_ARGS_PARAMS, const long long* __restrict__ split_tgt,
                                              const long long* __restrict__ slot_ptr, const long long* __restrict__ slot_ids,
                                              long long n_split, const float* __restrict__ partial,
                                              float* __restrict__ out, float* __restrict__ m_out, float* __restrict__ l_out) {
  GAT_ARGS_INIT;
  const int lane = threadIdx.x & 31;
  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
  const int HC = a.H * a.C, stride = 1 + 2 * a.H + HC;
  for (long long t = warp; t < n_split; t += n_warps) {
    OnlineState s;
    state_init(s, a);
    for (long long q = slot_ptr[t]; q < slot_ptr[t + 1]; ++q) {
      const float* p = partial + slot_ids[q] * stride;
      float scale_s[MGG_MAXH], scale_p[MGG_MAXH];
      for (int h = 0; h < a.H; ++h) {
        if (a.mode == MODE_MEAN) { scale_s[h] = scale_p[h] = 1.f; continue; }
        const float mn = fmaxf(s.m[h], p[1 + h]);
        scale_s[h] = __expf(s.m[h] - mn);
        scale_p[h] = __expf(p[1 + h] - mn);
        s.l[h] = s.l[h] * scale_s[h] + p[1 + a.H + h] * scale_p[h];
        s.m[h] = mn;
      }
#pragma unroll
      for (int kk = 0; kk < MGG_KMAX; ++kk) {
        const int f = lane + 32 * kk;
        if (f < HC) {
          const int h = f / a.C;
          s.acc[kk] = s.acc[kk] * scale_s[h] + p[1 + 2 * a.H + f] * scale_p[h];
        }
      }
    }
    state_store(s, a, split_tgt[t], out, m_out, l_out, lane);
  }
}

// edge-centric backward: each warp EPW consecutive edges; target-side sums are atomics
extern "C" __global__ void gat_bwd_edge(GAT_ARGS_PARAMS, const float* local, const float* halo, const float* __restrict__ dst,
                                        const long long* __restrict__ e_tgt, const long long* __restrict__ e_src,
                                        const long long* __restrict__ e_id, long long E, int epw,
                                        const float* __restrict__ mean_w, const float* __restrict__ g,
                                        const float* __restrict__ c, const float* __restrict__ m,
                                        const float* __restrict__ l, float* grad_local, float* grad_halo,
                                        float* grad_dst) {
  GAT_ARGS_INIT;
  const int lane = threadIdx.x & 31;
  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const long long b = warp * epw;
  if (b >= E) return;
  const long long end = min(b + (long long)epw, E);
  const int HC = a.H * a.C;
  long long k = b;
  const int kk_cols = cols_ok(a) ? (HC + 31) / 32 : 0;  // 0: the general per-head path
  while (k < end) {
    const long long i = e_tgt[k];
    if (kk_cols) {
      switch (kk_cols) {
        case 1: k = bwd_run_cols<1>(a, local, halo, dst, e_tgt, e_src, e_id, k, end, i, g, c, m, l, grad_local, grad_halo, grad_dst, lane); break;
        case 2: k = bwd_run_cols<2>(a, local, halo, dst, e_tgt, e_src, e_id, k, end, i, g, c, m, l, grad_local, grad_halo, grad_dst, lane); break;
        case 3: case 4: k = bwd_run_cols<4>(a, local, halo, dst, e_tgt, e_src, e_id, k, end, i, g, c, m, l, grad_local, grad_halo, grad_dst, lane); break;
        default: k = bwd_run_cols<8>(a, local, halo, dst, e_tgt, e_src, e_id, k, end, i, g, c, m, l, grad_local, grad_halo, grad_dst, lane); break;
      }
      continue;
    }
    float gdst[MGG_MAXH], gq[MGG_KMAX];
    for (int h = 0; h < a.H; ++h) gdst[h] = 0.f;
#pragma unroll
    for (int kk = 0; kk < MGG_KMAX; ++kk) gq[kk] = 0.f;
    const float* row_i = local + i * a.W;
    const float mw = (a.mode == MODE_MEAN) ? mean_w[i] : 0.f;
    long long q = k;
    for (; q < end && e_tgt[q] == i; ++q) {
      const long long s = e_src[q];
      float* grad_j = s < a.n_local ? grad_local + s * a.W : grad_halo + (s - a.n_local) * a.W;
      bwd_edge(a, edge_row(a, local, halo, s), row_i, dst + i * a.H, g + i * HC, c + i * a.H,
               m + i * a.H, l + i * a.H, e_id[q], mw, grad_j, gdst, gq, lane);
    }
    if (a.mode == MODE_ADDITIVE) {
      if (lane == 0) for (int h = 0; h < a.H; ++h) atomicAdd(grad_dst + i * a.H + h, gdst[h]);
    } else if (a.mode == MODE_DOT) {
#pragma unroll
      for (int kk = 0; kk < MGG_KMAX; ++kk) {
        const int f = lane + 32 * kk;
        if (f < HC) atomicAdd(grad_dst + i * HC + f, gq[kk]);
      }
    }
    k = q;
  }
}
