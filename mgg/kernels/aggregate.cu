// MGG aggregation kernels: out[t] += sum_j w_j * x[j] over neighbor partitions (MGG §5).
//
// Layout shared by every kernel
//   * Embeddings live in the NVSHMEM symmetric array `sym` ([rows_per_pe, Dp] float32 on every PE,
//     Dp = D rounded up to a multiple of 4 so that every row is 16-byte aligned). A PE's own rows
//     are read directly, other PEs' rows through NVSHMEM (warp-level get into shared memory, or
//     direct NVLink loads through nvshmem_ptr).
//   * A neighbor partition q is (target[q], start[q], end[q]) into a CSR (<= ps entries); the
//     entries give the source row (local id, or owner PE + row in the owner's slice) and a weight.
//   * Rows are handled as float4. A warp splits into G = 32 / L lane groups of L lanes
//     (L = min(32, pow2ceil(Dp/4))): each group walks every G-th neighbor of the partition, each
//     lane owns VPL float4 columns (c, c+L, ...). Groups are combined with __shfl_xor, then
//     group 0 adds the partition's partial sum to out[target] (float4 atomicAdd, sm_90) or stores
//     it to a per-partition buffer for the two-pass combine.
//
// Kernels (one job each)
//   mgg_local            one warp per local partition (grid-stride); kernel 1 of the design
//   mgg_remote_get       one warp per remote partition; §5.2 shared-memory layout: ps neighbor
//                        ids + Dp partial sums + Dp remote buffer per warp (Eq. 1); each neighbor
//                        row is fetched with nvshmemx_float_get_warp (blocking) or _nbi + quiet
//   mgg_pipelined        §5.1 / Fig. 6(b): warp w owns local partitions [lb, le) and remote
//                        partitions [rb, re) (dist of each); for each pair it issues the remote
//                        rows as _nbi gets (one row per lane) into its shared-memory stage, aggregates the local
//                        partition meanwhile, waits (quiet) and aggregates the staged rows.
//                        REMOTE_MODE 1 = direct loads through nvshmem_ptr instead of gets.
//   mgg_split            baseline (b): the same work with local and remote partitions mapped to
//                        different warps (warps [0, L) local, [L, L+R) remote), no interleaving
//   mgg_halo_gather      one warp per unique remote row: copy it from its owner into a private
//                        halo buffer (nvshmem_ptr loads over NVLink, else a warp get)
//   mgg_halo_gather_rows the same, G = 32 / L rows per warp (narrow rows), optionally scaled
//                        by a per-row factor (halo_csr's prescaled GCN table)
//   mgg_combine          second pass of the two-pass variant: one warp per target sums its
//                        partitions' partial sums (no atomics)
//   mgg_local_{bf16,fp16}_v{V}  mgg_local over a 16-bit table (storage dtype bf16 / fp16, see
//                        docs/storage-dtype.md): rows of DV 16-byte vectors of 8 elements, each
//                        loaded whole and converted to two float4 in registers, float32 sums and
//                        float32 output [*, 2 * DV] float4. With mgg_halo_gather (which copies
//                        16-byte vectors, so it moves 16-bit rows unchanged when given DV) this is
//                        the halo variant's 16-bit path; the other variants are fp32 only.
//
// Launch geometry: blockDim.x = 32 * wpb; warps are numbered globally (blockIdx.x * wpb + warp).
#include <cuda_fp16.h>
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
#include <stdint.h>

#define FULL 0xffffffffu

// Dynamic shared memory of every kernel (its layout is documented per kernel).
extern __shared__ __align__(16) unsigned char smem[];

struct Lanes {
  int lane, L, g, G, c;  // lane id, lanes per row, my group, groups, my first float4 column
};

__device__ __forceinline__ Lanes lanes_for(int D4) {
  Lanes l;
  l.lane = threadIdx.x & 31;
  int L = 1;
  while (L < D4 && L < 32) L <<= 1;
  l.L = L;
  l.G = 32 / L;
  l.g = l.lane / L;
  l.c = l.lane % L;
  return l;
}

template <int VPL>
__device__ __forceinline__ void zero(float4 (&a)[VPL]) {
#pragma unroll
  for (int v = 0; v < VPL; ++v) a[v] = make_float4(0.f, 0.f, 0.f, 0.f);
}

template <int VPL>
__device__ __forceinline__ void axpy_row(float4 (&a)[VPL], const float4* __restrict__ row, float w,
                                         const Lanes& l, int D4) {
#pragma unroll
  for (int v = 0; v < VPL; ++v) {
    int col = l.c + v * l.L;
    if (col < D4) {
      float4 x = row[col];
      a[v].x += w * x.x; a[v].y += w * x.y; a[v].z += w * x.z; a[v].w += w * x.w;
    }
  }
}

// Sum the G lane groups (lanes with the same column chunk); every lane ends with the total.
template <int VPL>
__device__ __forceinline__ void reduce_groups(float4 (&a)[VPL], const Lanes& l) {
  for (int off = l.L; off < 32; off <<= 1) {
#pragma unroll
    for (int v = 0; v < VPL; ++v) {
      a[v].x += __shfl_xor_sync(FULL, a[v].x, off);
      a[v].y += __shfl_xor_sync(FULL, a[v].y, off);
      a[v].z += __shfl_xor_sync(FULL, a[v].z, off);
      a[v].w += __shfl_xor_sync(FULL, a[v].w, off);
    }
  }
}

// Group 0 writes the partition's partial: atomically into out[target] (ATOMIC) or into part_out.
template <int VPL, bool ATOMIC>
__device__ __forceinline__ void emit(float4 (&a)[VPL], const Lanes& l, int D4, float4* __restrict__ out,
                                     long long target, float4* __restrict__ part_out, long long q) {
  if (l.g != 0) return;
#pragma unroll
  for (int v = 0; v < VPL; ++v) {
    int col = l.c + v * l.L;
    if (col < D4) {
      if (ATOMIC) {
        atomicAdd(out + target * D4 + col, a[v]);
      } else {
        part_out[q * D4 + col] = a[v];
      }
    }
  }
}

// One local partition (or any partition whose sources are rows of `table`).
template <int VPL, bool ATOMIC>
__device__ __forceinline__ void do_table_part(long long q, const long long* __restrict__ parts,
                                              const int* __restrict__ src, const float* __restrict__ wt,
                                              const float4* __restrict__ table, const Lanes& l, int D4,
                                              float4* __restrict__ out, float4* __restrict__ part_out) {
  long long t = parts[3 * q], s = parts[3 * q + 1], e = parts[3 * q + 2];
  float4 acc[VPL];
  zero(acc);
  for (long long j = s + l.g; j < e; j += l.G) axpy_row(acc, table + (long long)src[j] * D4, wt[j], l, D4);
  reduce_groups(acc, l);
  emit<VPL, ATOMIC>(acc, l, D4, out, t, part_out, q);
}

// ---------------------------------------------------------------------------------------------
// Kernel 1: local partitions, one warp each.
template <int VPL, bool ATOMIC>
__device__ void local_body(long long nparts, const long long* __restrict__ parts, const int* __restrict__ src,
                           const float* __restrict__ wt, const float4* __restrict__ x, int D4,
                           float4* __restrict__ out, float4* __restrict__ part_out) {
  Lanes l = lanes_for(D4);
  long long warps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long q = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); q < nparts; q += warps)
    do_table_part<VPL, ATOMIC>(q, parts, src, wt, x, l, D4, out, part_out);
}

#define DEF_LOCAL(V)                                                                                     \
  extern "C" __global__ void mgg_local_v##V(long long nparts, const long long* parts, const int* src,   \
                                            const float* wt, const float4* x, int D4, float4* out,      \
                                            float4* part_out, int atomic) {                            \
    if (atomic) local_body<V, true>(nparts, parts, src, wt, x, D4, out, part_out);                      \
    else local_body<V, false>(nparts, parts, src, wt, x, D4, out, part_out);                            \
  }
DEF_LOCAL(1) DEF_LOCAL(2) DEF_LOCAL(4) DEF_LOCAL(8)

// ---------------------------------------------------------------------------------------------
// Kernel 1 over a 16-bit table. S = 1: bfloat16 (the top half of a float32), S = 2: float16.
// Lane c of a group owns the 16-byte vectors c, c + L, ... (VPL of them), i.e. the output float4
// columns 2c and 2c + 1 of each; the partition's sum goes to out[target] with float4 atomics.
template <int S>
__device__ __forceinline__ void unpack16(const uint4& u, float4& a, float4& b);

template <>
__device__ __forceinline__ void unpack16<1>(const uint4& u, float4& a, float4& b) {
  a = make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                  __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
  b = make_float4(__uint_as_float(u.z << 16), __uint_as_float(u.z & 0xffff0000u),
                  __uint_as_float(u.w << 16), __uint_as_float(u.w & 0xffff0000u));
}

template <>
__device__ __forceinline__ void unpack16<2>(const uint4& u, float4& a, float4& b) {
  float2 p = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
  float2 q = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
  float2 r = __half22float2(*reinterpret_cast<const __half2*>(&u.z));
  float2 t = __half22float2(*reinterpret_cast<const __half2*>(&u.w));
  a = make_float4(p.x, p.y, q.x, q.y);
  b = make_float4(r.x, r.y, t.x, t.y);
}

template <int S, int VPL>
__device__ __forceinline__ void axpy_row16(float4 (&a)[2 * VPL], const uint4* __restrict__ row, float w,
                                           const Lanes& l, int DV) {
#pragma unroll
  for (int v = 0; v < VPL; ++v) {
    int col = l.c + v * l.L;
    if (col < DV) {
      float4 p, q;
      unpack16<S>(__ldg(row + col), p, q);
      a[2 * v].x += w * p.x; a[2 * v].y += w * p.y; a[2 * v].z += w * p.z; a[2 * v].w += w * p.w;
      a[2 * v + 1].x += w * q.x; a[2 * v + 1].y += w * q.y; a[2 * v + 1].z += w * q.z; a[2 * v + 1].w += w * q.w;
    }
  }
}

template <int S, int VPL>
__device__ void local16_body(long long nparts, const long long* __restrict__ parts, const int* __restrict__ src,
                             const float* __restrict__ wt, const uint4* __restrict__ x, int DV,
                             float4* __restrict__ out) {
  Lanes l = lanes_for(DV);
  long long warps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long q = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); q < nparts; q += warps) {
    long long t = parts[3 * q], s = parts[3 * q + 1], e = parts[3 * q + 2];
    float4 acc[2 * VPL];
    zero(acc);
    for (long long j = s + l.g; j < e; j += l.G) axpy_row16<S, VPL>(acc, x + (long long)src[j] * DV, wt[j], l, DV);
    reduce_groups(acc, l);
    if (l.g != 0) continue;
#pragma unroll
    for (int v = 0; v < VPL; ++v) {
      int col = l.c + v * l.L;
      if (col < DV) {
        atomicAdd(out + t * 2 * DV + 2 * col, acc[2 * v]);
        atomicAdd(out + t * 2 * DV + 2 * col + 1, acc[2 * v + 1]);
      }
    }
  }
}

#define DEF_LOCAL16(S, SFX, V)                                                                           \
  extern "C" __global__ void mgg_local_##SFX##_v##V(long long nparts, const long long* parts,           \
                                                    const int* src, const float* wt, const uint4* x,   \
                                                    int DV, float4* out) {                             \
    local16_body<S, V>(nparts, parts, src, wt, x, DV, out);                                              \
  }
DEF_LOCAL16(1, bf16, 1) DEF_LOCAL16(1, bf16, 2) DEF_LOCAL16(1, bf16, 4)
DEF_LOCAL16(2, fp16, 1) DEF_LOCAL16(2, fp16, 2) DEF_LOCAL16(2, fp16, 4)

// ---------------------------------------------------------------------------------------------
// Kernel 2: remote partitions with the §5.2 shared-memory layout (Eq. 1):
//   [ wpb * ps ints: neighbor ids ][ wpb * Dp floats: partial sums ][ wpb * Dp floats: remote row ]
// One neighbor row at a time is fetched into the warp's remote buffer and added to its partial.
extern "C" __global__ void mgg_remote_get(long long nparts, const long long* __restrict__ parts,
                                          const int* __restrict__ rpe, const int* __restrict__ rrow,
                                          const float* __restrict__ wt, const float* sym, int D4, int ps,
                                          float* __restrict__ out, int nbi) {
  const int wpb = blockDim.x >> 5, w = threadIdx.x >> 5, lane = threadIdx.x & 31, Dp = 4 * D4;
  int* ids = reinterpret_cast<int*>(smem) + w * ps;
  float* partial = reinterpret_cast<float*>(smem + (size_t)wpb * ps * sizeof(int)) + (size_t)w * Dp;
  float* rbuf = reinterpret_cast<float*>(smem + (size_t)wpb * ps * sizeof(int)) + (size_t)(wpb + w) * Dp;
  long long warps = (long long)gridDim.x * wpb;
  for (long long q = (long long)blockIdx.x * wpb + w; q < nparts; q += warps) {
    long long t = parts[3 * q], s = parts[3 * q + 1], e = parts[3 * q + 2];
    for (int k = lane; k < e - s; k += 32) ids[k] = (int)(s + k);  // entry ids of this partition
    for (int d = lane; d < Dp; d += 32) partial[d] = 0.f;
    __syncwarp();
    for (int k = 0; k < e - s; ++k) {
      long long j = ids[k];
      const float* srcrow = sym + (long long)rrow[j] * Dp;
      if (nbi) {
        nvshmemx_float_get_nbi_warp(rbuf, srcrow, Dp, rpe[j]);
        nvshmem_quiet();
      } else {
        nvshmemx_float_get_warp(rbuf, srcrow, Dp, rpe[j]);
      }
      __syncwarp();
      float wj = wt[j];
      for (int d = lane; d < Dp; d += 32) partial[d] += wj * rbuf[d];
      __syncwarp();
    }
    for (int d = lane; d < Dp; d += 32) atomicAdd(out + t * Dp + d, partial[d]);
    __syncwarp();
  }
}

// ---------------------------------------------------------------------------------------------
// Remote partition from a staging buffer: rows fetched by get_nbi (REMOTE_MODE 0) or read in place
// through nvshmem_ptr (REMOTE_MODE 1).
template <int VPL>
__device__ __forceinline__ void issue_remote(long long q, const long long* __restrict__ parts,
                                             const int* __restrict__ rpe, const int* __restrict__ rrow,
                                             const float* sym, int D4, float* stage) {
  // one row per lane: up to 32 rows of the partition in flight at once (a warp-collective get
  // per row would serialise them)
  long long s = parts[3 * q + 1], e = parts[3 * q + 2];
  const int Dp = 4 * D4;
  for (long long j = s + (threadIdx.x & 31); j < e; j += 32)
    nvshmem_float_get_nbi(stage + (j - s) * Dp, sym + (long long)rrow[j] * Dp, Dp, rpe[j]);
}

template <int VPL, bool ATOMIC>
__device__ __forceinline__ void finish_remote_staged(long long q, const long long* __restrict__ parts,
                                                     const float* __restrict__ wt, const float* stage,
                                                     const Lanes& l, int D4, float4* __restrict__ out,
                                                     float4* __restrict__ part_out) {
  long long t = parts[3 * q], s = parts[3 * q + 1], e = parts[3 * q + 2];
  float4 acc[VPL];
  zero(acc);
  const float4* st = reinterpret_cast<const float4*>(stage);
  for (long long j = s + l.g; j < e; j += l.G) axpy_row(acc, st + (j - s) * D4, wt[j], l, D4);
  reduce_groups(acc, l);
  emit<VPL, ATOMIC>(acc, l, D4, out, t, part_out, q);
}

template <int VPL, bool ATOMIC>
__device__ __forceinline__ void remote_direct(long long q, const long long* __restrict__ parts,
                                              const int* __restrict__ rpe, const int* __restrict__ rrow,
                                              const float* __restrict__ wt, const float4* const* bases,
                                              const Lanes& l, int D4, float4* __restrict__ out,
                                              float4* __restrict__ part_out) {
  long long t = parts[3 * q], s = parts[3 * q + 1], e = parts[3 * q + 2];
  float4 acc[VPL];
  zero(acc);
  for (long long j = s + l.g; j < e; j += l.G)
    axpy_row(acc, bases[rpe[j]] + (long long)rrow[j] * D4, wt[j], l, D4);
  reduce_groups(acc, l);
  emit<VPL, ATOMIC>(acc, l, D4, out, t, part_out, q);
}

#define MGG_MAX_PES 64

// Peer base pointers (NVLink mappings) of `sym` for every PE, in shared memory.
__device__ __forceinline__ void load_bases(const float* sym, const float4** bases) {
  int npes = nvshmem_n_pes();
  for (int p = threadIdx.x; p < npes && p < MGG_MAX_PES; p += blockDim.x)
    bases[p] = reinterpret_cast<const float4*>(nvshmem_ptr(sym, p));
  __syncthreads();
}

// Kernel 3: the interleaved, pipelined kernel (§5.1, Fig. 6(b)).
// Shared memory: [wpb * ps * Dp floats: remote stage] (mode 0); none beyond the PE table (mode 1).
template <int VPL, bool ATOMIC, int REMOTE_MODE>
__device__ void pipelined_body(long long nwarps, const long long* __restrict__ warps,
                               const long long* __restrict__ lparts, const int* __restrict__ lsrc,
                               const float* __restrict__ lwt, const long long* __restrict__ rparts,
                               const int* __restrict__ rpe, const int* __restrict__ rrow,
                               const float* __restrict__ rwt, const float* sym, int D4, int ps,
                               float4* __restrict__ out, float4* __restrict__ lpart_out,
                               float4* __restrict__ rpart_out) {
  __shared__ const float4* bases[MGG_MAX_PES];
  if (REMOTE_MODE == 1) load_bases(sym, bases);
  const int wpb = blockDim.x >> 5, w = threadIdx.x >> 5;
  const float4* x = reinterpret_cast<const float4*>(sym);  // my own slice
  float* stage = reinterpret_cast<float*>(smem) + (size_t)w * ps * 4 * D4;
  Lanes l = lanes_for(D4);
  long long gw = (long long)blockIdx.x * wpb + w;
  if (gw >= nwarps) return;
  long long lb = warps[4 * gw], le = warps[4 * gw + 1], rb = warps[4 * gw + 2], re = warps[4 * gw + 3];
  long long n = (le - lb) > (re - rb) ? (le - lb) : (re - rb);
  for (long long k = 0; k < n; ++k) {
    long long lq = lb + k, rq = rb + k;
    bool has_l = lq < le, has_r = rq < re;
    if (REMOTE_MODE == 0 && has_r) issue_remote<VPL>(rq, rparts, rpe, rrow, sym, D4, stage);  // 1: async get
    if (has_l) do_table_part<VPL, ATOMIC>(lq, lparts, lsrc, lwt, x, l, D4, out, lpart_out);    // local meanwhile
    if (has_r) {
      if (REMOTE_MODE == 0) {
        nvshmem_quiet();  // 2: wait for the remote rows
        __syncwarp();
        finish_remote_staged<VPL, ATOMIC>(rq, rparts, rwt, stage, l, D4, out, rpart_out);
        __syncwarp();     // the stage is reused by the next pair
      } else {
        remote_direct<VPL, ATOMIC>(rq, rparts, rpe, rrow, rwt, bases, l, D4, out, rpart_out);
      }
    }
  }
}

#define DEF_PIPE(V)                                                                                      \
  extern "C" __global__ void mgg_pipelined_v##V(long long nwarps, const long long* warps,              \
      const long long* lparts, const int* lsrc, const float* lwt, const long long* rparts,             \
      const int* rpe, const int* rrow, const float* rwt, const float* sym, int D4, int ps,             \
      float4* out, float4* lpo, float4* rpo, int atomic, int mode) {                                   \
    if (mode == 0) {                                                                                   \
      if (atomic) pipelined_body<V, true, 0>(nwarps, warps, lparts, lsrc, lwt, rparts, rpe, rrow, rwt, sym, D4, ps, out, lpo, rpo); \
      else pipelined_body<V, false, 0>(nwarps, warps, lparts, lsrc, lwt, rparts, rpe, rrow, rwt, sym, D4, ps, out, lpo, rpo); \
    } else {                                                                                           \
      if (atomic) pipelined_body<V, true, 1>(nwarps, warps, lparts, lsrc, lwt, rparts, rpe, rrow, rwt, sym, D4, ps, out, lpo, rpo); \
      else pipelined_body<V, false, 1>(nwarps, warps, lparts, lsrc, lwt, rparts, rpe, rrow, rwt, sym, D4, ps, out, lpo, rpo); \
    }                                                                                                  \
  }
DEF_PIPE(1) DEF_PIPE(2) DEF_PIPE(4) DEF_PIPE(8)

// Baseline (b): the same partitions, local and remote on different warps (no interleaving):
// warps [0, nl) take local partitions, warps [nl, nl + nr) remote ones (get into the stage, quiet).
template <int VPL>
__device__ void split_body(long long nl, long long nr, const long long* __restrict__ lparts,
                           const int* __restrict__ lsrc, const float* __restrict__ lwt,
                           const long long* __restrict__ rparts, const int* __restrict__ rpe,
                           const int* __restrict__ rrow, const float* __restrict__ rwt, const float* sym,
                           int D4, int ps, float4* __restrict__ out) {
  const int wpb = blockDim.x >> 5, w = threadIdx.x >> 5;
  float* stage = reinterpret_cast<float*>(smem) + (size_t)w * ps * 4 * D4;
  Lanes l = lanes_for(D4);
  long long gw = (long long)blockIdx.x * wpb + w;
  if (gw < nl) {
    do_table_part<VPL, true>(gw, lparts, lsrc, lwt, reinterpret_cast<const float4*>(sym), l, D4, out, nullptr);
  } else if (gw < nl + nr) {
    long long q = gw - nl;
    issue_remote<VPL>(q, rparts, rpe, rrow, sym, D4, stage);
    nvshmem_quiet();
    __syncwarp();
    finish_remote_staged<VPL, true>(q, rparts, rwt, stage, l, D4, out, nullptr);
  }
}

#define DEF_SPLIT(V)                                                                                     \
  extern "C" __global__ void mgg_split_v##V(long long nl, long long nr, const long long* lparts,       \
      const int* lsrc, const float* lwt, const long long* rparts, const int* rpe, const int* rrow,     \
      const float* rwt, const float* sym, int D4, int ps, float4* out) {                               \
    split_body<V>(nl, nr, lparts, lsrc, lwt, rparts, rpe, rrow, rwt, sym, D4, ps, out);                \
  }
DEF_SPLIT(1) DEF_SPLIT(2) DEF_SPLIT(4) DEF_SPLIT(8)

// Halo variant, step 1: fetch each unique remote row once into a private buffer. It moves D4
// 16-byte vectors per row whatever they hold: 16-bit rows are gathered unchanged (D4 = DV).
extern "C" __global__ void mgg_halo_gather(long long nrows, const int* __restrict__ hpe,
                                           const int* __restrict__ hrow, const float* sym, int D4,
                                           float4* __restrict__ halo) {
  __shared__ const float4* bases[MGG_MAX_PES];
  load_bases(sym, bases);
  const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
  long long warps = (long long)gridDim.x * wpb;
  for (long long h = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); h < nrows; h += warps) {
    int pe = hpe[h];
    const float4* b = bases[pe];
    if (b != nullptr) {
      for (int c = lane; c < D4; c += 32) halo[h * D4 + c] = b[(long long)hrow[h] * D4 + c];
    } else {
      nvshmemx_float_get_warp(reinterpret_cast<float*>(halo + h * D4), sym + (long long)hrow[h] * 4 * D4,
                              4 * D4, pe);
    }
  }
}

// halo_csr, step 1 (mgg/kernels/halo_csr.py): every unique remote row once into a private halo
// buffer, halo[h] = scale[h] * x_{hpe[h]}[hrow[h]] (scale null: a copy; scale is float32 rows
// only). Narrow rows do not idle a warp: G = 32 / L rows per warp at once, L = pow2ceil(D4)
// lanes per row (at most 32), each lane a float4 column c, c + L, ... of its row.
// Each lane group keeps GATHER_ILP rows' loads in flight (rows h, h + S, ..., S = the grid's lane
// groups) before it stores any: an NVLink load waits microseconds, and independent loads overlap
// those waits. The grid is halo_csr.GATHER_BLOCKS_PER_SM blocks an SM (where that is measured).
// Geometry: blockDim.x = 32 * wpb, grid-stride over GATHER_ILP * S rows.
#define GATHER_ILP 8
extern "C" __global__ void mgg_halo_gather_rows(long long nrows, const int* __restrict__ hpe,
                                                const int* __restrict__ hrow, const float* sym, int D4,
                                                const float* __restrict__ scale, float4* __restrict__ halo) {
  __shared__ const float4* bases[MGG_MAX_PES];
  load_bases(sym, bases);
  Lanes l = lanes_for(D4);
  const int wpb = blockDim.x >> 5;
  const long long S = (long long)gridDim.x * wpb * l.G;
  const long long mine = ((long long)blockIdx.x * wpb + (threadIdx.x >> 5)) * l.G + l.g;
  for (long long base = mine; base < nrows; base += GATHER_ILP * S) {
    int pe[GATHER_ILP];
    long long r[GATHER_ILP];
    float f[GATHER_ILP];
#pragma unroll
    for (int u = 0; u < GATHER_ILP; ++u) {
      const long long h = base + u * S;
      pe[u] = h < nrows ? hpe[h] : -1;
      r[u] = h < nrows ? (long long)hrow[h] : 0;
      f[u] = (scale && h < nrows) ? scale[h] : 1.f;
    }
    for (int c = l.c; c < D4; c += l.L) {
      float4 v[GATHER_ILP];
#pragma unroll
      for (int u = 0; u < GATHER_ILP; ++u)  // every load issued before any is used
        if (pe[u] >= 0 && bases[pe[u]] != nullptr) v[u] = bases[pe[u]][r[u] * D4 + c];
#pragma unroll
      for (int u = 0; u < GATHER_ILP; ++u) {
        if (pe[u] < 0) continue;
        const long long h = base + u * S;
        if (bases[pe[u]] == nullptr) {  // no load path to that PE: a thread-level get of the vector
          nvshmem_getmem(&halo[h * D4 + c], sym + (r[u] * D4 + c) * 4, sizeof(float4), pe[u]);
          v[u] = halo[h * D4 + c];
        }
        if (scale) { v[u].x *= f[u]; v[u].y *= f[u]; v[u].z *= f[u]; v[u].w *= f[u]; }
        halo[h * D4 + c] = v[u];
      }
    }
  }
}

// Two-pass variant, step 2: out[t] = sum of t's local and remote partition partials (no atomics).
extern "C" __global__ void mgg_combine(long long n, const long long* __restrict__ lptr,
                                       const long long* __restrict__ rptr, const float4* __restrict__ lpo,
                                       const float4* __restrict__ rpo, int D4, float4* __restrict__ out) {
  const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
  long long warps = (long long)gridDim.x * wpb;
  for (long long t = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); t < n; t += warps) {
    for (int c = lane; c < D4; c += 32) {
      float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
      for (long long q = lptr[t]; q < lptr[t + 1]; ++q) {
        float4 v = lpo[q * D4 + c]; a.x += v.x; a.y += v.y; a.z += v.z; a.w += v.w;
      }
      for (long long q = rptr[t]; q < rptr[t + 1]; ++q) {
        float4 v = rpo[q * D4 + c]; a.x += v.x; a.y += v.y; a.z += v.z; a.w += v.w;
      }
      out[t * D4 + c] = a;
    }
  }
}
