// Tall-skinny projection with the hash dropout fused in: out = dropout(x) @ W^T, and its weight
// gradient grad_W = dropout(x)^T @ G, for x float32 [n, F] with n in the millions, F % 4 == 0
// (F <= 256 for the weight gradient) and O <= 32 outputs. The dropped x is never written: each
// kernel regenerates the keep decision of (global row row0 + r, column c) from the seed, bit for
// bit the one of mgg/kernels/dropout.cu and mgg.nn.functional.hash_uniform:
//     h_row = lowbias32((row & 0xffffffff) ^ s1); u = (lowbias32(h_row ^ (c * 0x9E3779B1 + s2)) >> 8) / 2^24
//     x'[r, c] = (x[r, c] * (u >= p ? 1 : 0)) * scale          (dropout = 0: x' = x)
// (the kernels take p as the integer threshold ceil(p 2^24) of h >> 8, the same decision)
//
// Kernels
//   mgg_dp_fwd_o{OT}         out[r, o] = sum_c x'[r, c] W[o, c]. One thread per row (grid-stride):
//                            W^T sits in shared memory as [F, OT] floats (read as broadcast
//                            float4s); a thread walks its row 16 columns at a time (four float4
//                            loads in flight), keeps OT sums in registers and writes its output
//                            row (float4 stores when O % 4 == 0). With `mask` (training) it also
//                            writes the row's keep bits, mask[r, w] bit b = column 32 w + b kept
//                            (uint32 [n, ceil(F / 32)], 1/32 of x's bytes), so the weight gradient
//                            reads them instead of hashing again. No shuffles, no reductions: per
//                            row it issues F * OT / 32 FMAs, F * OT / 128 shared loads and the hash,
//                            where a warp-per-row mapping also spent OT - 1 + log2(32 / OT)
//                            shuffles and twice as many selects on the butterfly.
//   mgg_dp_wgrad_o{OT}_j{J}  partial[w, c, o] = sum over warp w's rows of x'[r, c] G[r, o]. A block
//                            walks tiles of WPB * R rows: it stages the tile's rows of G in shared
//                            memory (coalesced), then warp w takes R rows of the tile, lane l owning
//                            columns 4l + 128j (j < J): R row loads in flight per warp, G read as
//                            broadcast float4s from shared memory, 4 J x OT sums in registers,
//                            the keep bits from `mask` when given (else the hash, as the forward).
//                            A tile's x rows and G rows are loaded together and the dropout is
//                            applied before the G rows are stored: one memory round trip per tile,
//                            written at the end; the caller sums the [warps, F, O] partials (a
//                            fixed order: deterministic).
// Row scale: with `row_scale` (float32 [n], or null) the forward writes row_scale[r] * out[r, :]
// and the weight gradient reads G's row r as row_scale[r] * G[r, :] -- the output of a projection
// with a per-row factor folded in (the gcn column factor of the aggregation that reads it,
// mgg.nn.dense.dropout_project(row_scale=)); (s x) W^T = s (x W^T), so x itself is not scaled.
// Launch geometry: fwd: blockDim.x = any multiple of 32, dynamic shared memory F * OT * 4 bytes;
// wgrad: blockDim.x = 32 * WPB with WPB = DP_WPB, no dynamic shared memory. gridDim.x = blocks
// (the launcher picks a few per SM). x, out, G contiguous row-major; W [O, F] row-major; 16-byte
// aligned x, out and G. OT is O rounded up to 8, 16 or 32 (outputs >= O are not written);
// wgrad: J = ceil(F / 128) <= 2 and OT * J <= 32 (a lane's 4 * J * OT sums stay in registers).
// (launch bounds: 2 blocks per SM while OT * J <= 16, so those stay within 128 registers)
#include <stdint.h>

#include "dropout_hash.cuh"

// u >= p with u = (h >> 8) / 2^24 exactly (a 24-bit integer over 2^24) is (h >> 8) >= ceil(p 2^24):
// the launcher passes that threshold, and the compare stays integer (no int -> float convert)
__device__ __forceinline__ float dp_keep(uint32_t h_row, uint32_t col, uint32_t s2, uint32_t thresh) {
  const uint32_t h = mgg_lowbias32(h_row ^ (col * 0x9E3779B1u + s2));
  return (h >> 8) >= thresh ? 1.0f : 0.0f;
}

// the dropout of 4 loaded values of columns c0 .. c0 + 3: (v * keep) * scale, keep from the hash
__device__ __forceinline__ float4 dp_apply_hash(float4 v, uint32_t h_row, uint32_t c0, uint32_t s2, uint32_t p,
                                                float scale) {
  v.x = (v.x * dp_keep(h_row, c0 + 0, s2, p)) * scale;
  v.y = (v.y * dp_keep(h_row, c0 + 1, s2, p)) * scale;
  v.z = (v.z * dp_keep(h_row, c0 + 2, s2, p)) * scale;
  v.w = (v.w * dp_keep(h_row, c0 + 3, s2, p)) * scale;
  return v;
}

// the same from stored keep bits (the low 4 of `bits`): the same values as dp_apply_hash
__device__ __forceinline__ float4 dp_apply_bits(float4 v, uint32_t bits, float scale) {
  v.x = (v.x * ((bits & 1u) ? 1.0f : 0.0f)) * scale;
  v.y = (v.y * ((bits & 2u) ? 1.0f : 0.0f)) * scale;
  v.z = (v.z * ((bits & 4u) ? 1.0f : 0.0f)) * scale;
  v.w = (v.w * ((bits & 8u) ? 1.0f : 0.0f)) * scale;
  return v;
}

// x'[r, c0 .. c0 + 3] (zeros past F)
__device__ __forceinline__ float4 dp_load(const float* __restrict__ x, long long r, int F, int c0, int drop,
                                          uint32_t h_row, uint32_t s2, uint32_t p, float scale) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (c0 < F) {
    v = *reinterpret_cast<const float4*>(x + r * F + c0);
    if (drop) v = dp_apply_hash(v, h_row, (uint32_t)c0, s2, p, scale);
  }
  return v;
}

#define DP_WPB 8                        // warps per block of the weight-gradient kernel
#define DP_R(J) ((J) == 1 ? 8 : 4)      // rows in flight per warp there

// x'[r, c0 .. c0 + 3] and its 4 keep bits (bit k: column c0 + k kept; 0 past F)
__device__ __forceinline__ float4 dp_load_bits(const float* __restrict__ x, long long r, int F, int c0,
                                               uint32_t h_row, uint32_t s2, uint32_t p, float scale,
                                               uint32_t* bits) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  *bits = 0u;
  if (c0 < F) {
    v = *reinterpret_cast<const float4*>(x + r * F + c0);
    const float k0 = dp_keep(h_row, (uint32_t)c0 + 0, s2, p), k1 = dp_keep(h_row, (uint32_t)c0 + 1, s2, p);
    const float k2 = dp_keep(h_row, (uint32_t)c0 + 2, s2, p), k3 = dp_keep(h_row, (uint32_t)c0 + 3, s2, p);
    v.x = (v.x * k0) * scale;
    v.y = (v.y * k1) * scale;
    v.z = (v.z * k2) * scale;
    v.w = (v.w * k3) * scale;
    *bits = (k0 != 0.f ? 1u : 0u) | (k1 != 0.f ? 2u : 0u) | (k2 != 0.f ? 4u : 0u) | (k3 != 0.f ? 8u : 0u);
  }
  return v;
}

template <int OT>
__device__ void dp_fwd(const float* __restrict__ x, const float* __restrict__ W, float* __restrict__ out,
                       uint32_t* __restrict__ mask, long long n, int F, int O, long long row0, uint32_t s1,
                       uint32_t s2, uint32_t p, float scale, int drop, const float* __restrict__ row_scale) {
  extern __shared__ float4 dp_smem4[];
  float* wt = reinterpret_cast<float*>(dp_smem4);  // W^T [F, OT], zeros past O
  for (int i = threadIdx.x; i < F * OT; i += blockDim.x) {
    const int c = i / OT, o = i - (i / OT) * OT;
    wt[i] = o < O ? W[(long long)o * F + c] : 0.f;
  }
  __syncthreads();
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x; r < n; r += stride) {
    const float* xr = x + r * F;
    const uint32_t h_row = mgg_lowbias32((uint32_t)((unsigned long long)(row0 + r) & 0xffffffffull) ^ s1);
    float acc[OT];
#pragma unroll
    for (int o = 0; o < OT; ++o) acc[o] = 0.f;
    const int words = (F + 31) >> 5;
    uint32_t word = 0u;  // keep bits of columns 32 (c0 / 32) ..
    for (int c0 = 0; c0 < F; c0 += 16) {
      float4 v[4];
      if (mask != nullptr) {  // drop != 0: keep the bits for the weight gradient
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          uint32_t b;
          v[k] = dp_load_bits(xr, 0, F, c0 + 4 * k, h_row, s2, p, scale, &b);
          word |= b << ((c0 & 31) + 4 * k);
        }
        if ((c0 & 31) == 16 || c0 + 16 >= F) {
          mask[r * words + (c0 >> 5)] = word;
          word = 0u;
        }
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = dp_load(xr, 0, F, c0 + 4 * k, drop, h_row, s2, p, scale);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int c = c0 + 4 * k;
        if (c < F) {  // the same for every thread: no divergence
          const float4* w4 = reinterpret_cast<const float4*>(wt + c * OT);
          const float e[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int q = 0; q < OT / 4; ++q) {
              const float4 ww = w4[i * (OT / 4) + q];
              acc[4 * q + 0] += e[i] * ww.x;
              acc[4 * q + 1] += e[i] * ww.y;
              acc[4 * q + 2] += e[i] * ww.z;
              acc[4 * q + 3] += e[i] * ww.w;
            }
        }
      }
    }
    if (row_scale != nullptr) {
      const float rs = __ldg(row_scale + r);
#pragma unroll
      for (int o = 0; o < OT; ++o) acc[o] *= rs;
    }
    float* dst = out + r * O;
    if ((O & 3) == 0) {
#pragma unroll
      for (int q = 0; q < OT / 4; ++q)
        if (4 * q < O) *reinterpret_cast<float4*>(dst + 4 * q) = make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]);
    } else {
#pragma unroll
      for (int o = 0; o < OT; ++o)
        if (o < O) dst[o] = acc[o];
    }
  }
}

template <int OT, int J>
__device__ void dp_wgrad(const float* __restrict__ x, const float* __restrict__ G,
                         const uint32_t* __restrict__ mask, float* __restrict__ partial, long long n, int F,
                         int O, long long row0, uint32_t s1, uint32_t s2, uint32_t p, float scale, int drop,
                         const float* __restrict__ row_scale) {
  constexpr int R = DP_R(J);
  constexpr int TR = DP_WPB * R;                 // rows per tile
  constexpr int GT = TR * OT / (32 * DP_WPB);    // values of the tile's G staged per thread
  __shared__ float4 gs4[TR * OT / 4];            // the tile's rows of G, [TR, OT], zeros past O / n
  const float* gs = reinterpret_cast<const float*>(gs4);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float acc[J][4][OT];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int o = 0; o < OT; ++o) acc[j][k][o] = 0.f;
  for (long long t0 = (long long)blockIdx.x * TR; t0 < n; t0 += (long long)gridDim.x * TR) {
    // 1. this warp's R rows of x as stored and (with `mask`) their keep words: the loads go out first
    float4 v[R][J];
    uint32_t bits[R][J];
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const long long r = t0 + warp * R + q;
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int c0 = 4 * lane + 128 * j;
        v[q][j] = r < n ? dp_load(x, r, F, c0, 0, 0u, 0u, 0u, 1.f) : make_float4(0.f, 0.f, 0.f, 0.f);
        bits[q][j] = (mask != nullptr && r < n && c0 < F) ? mask[r * ((F + 31) >> 5) + (c0 >> 5)] : 0u;
      }
    }
    // 2. the tile's rows of G (this thread's share, in registers while x's loads are in flight)
    float gt[GT];
#pragma unroll
    for (int k = 0; k < GT; ++k) {
      const int i = threadIdx.x + k * 32 * DP_WPB;
      const int rr = i / OT, o = i - (i / OT) * OT;
      const long long r = t0 + rr;
      gt[k] = (r < n && o < O) ? (row_scale != nullptr ? G[r * O + o] * __ldg(row_scale + r) : G[r * O + o]) : 0.f;
    }
    // 3. the dropout on the loaded values: the forward's keep bits when given, else the hash
    if (drop) {
#pragma unroll
      for (int q = 0; q < R; ++q) {
        const long long r = t0 + warp * R + q;
        const uint32_t h_row = mgg_lowbias32((uint32_t)((unsigned long long)(row0 + r) & 0xffffffffull) ^ s1);
#pragma unroll
        for (int j = 0; j < J; ++j) {
          const int c0 = 4 * lane + 128 * j;  // lane l's columns are bits 4 (l % 8).. of word l / 8 + 4j
          v[q][j] = mask != nullptr ? dp_apply_bits(v[q][j], bits[q][j] >> (4 * (lane & 7)), scale)
                                    : dp_apply_hash(v[q][j], h_row, (uint32_t)c0, s2, p, scale);
        }
      }
    }
    __syncthreads();  // every warp is done with the previous tile's G
#pragma unroll
    for (int k = 0; k < GT; ++k) reinterpret_cast<float*>(gs4)[threadIdx.x + k * 32 * DP_WPB] = gt[k];
    __syncthreads();  // the tile's G is staged
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const float4* g4 = reinterpret_cast<const float4*>(gs + (warp * R + q) * OT);
#pragma unroll
      for (int b = 0; b < OT / 4; ++b) {
        const float4 gg = g4[b];
        const float gv[4] = {gg.x, gg.y, gg.z, gg.w};
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
          for (int j = 0; j < J; ++j) {
            acc[j][0][4 * b + u] += v[q][j].x * gv[u];
            acc[j][1][4 * b + u] += v[q][j].y * gv[u];
            acc[j][2][4 * b + u] += v[q][j].z * gv[u];
            acc[j][3][4 * b + u] += v[q][j].w * gv[u];
          }
      }
    }
  }
  const long long wid = (long long)blockIdx.x * DP_WPB + warp;
  float* dst = partial + wid * (long long)F * O;
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int c = 4 * lane + 128 * j + k;
      if (c < F) {
#pragma unroll
        for (int o = 0; o < OT; ++o)
          if (o < O) dst[(long long)c * O + o] = acc[j][k][o];
      }
    }
}

#define DP_FWD_KERNEL(OT)                                                                              \
  extern "C" __global__ void mgg_dp_fwd_o##OT(                                                         \
      const float* __restrict__ x, const float* __restrict__ W, float* __restrict__ out,                \
      unsigned int* __restrict__ mask, long long n, int F, int O, long long row0, unsigned int s1,      \
      unsigned int s2, unsigned int p, float scale, int drop, const unsigned long long* seed_ptr,      \
      const float* __restrict__ row_scale) {                                                            \
    mgg_seed_from_device(seed_ptr, s1, s2);                                                             \
    dp_fwd<OT>(x, W, out, mask, n, F, O, row0, s1, s2, p, scale, drop, row_scale);                     \
  }
#define DP_WGRAD_KERNEL(OT, J)                                                                         \
  extern "C" __global__ void __launch_bounds__(32 * DP_WPB, (OT) * (J) <= 16 ? 2 : 1) mgg_dp_wgrad_o##OT##_j##J(                 \
      const float* __restrict__ x, const float* __restrict__ G, const unsigned int* __restrict__ mask,   \
      float* __restrict__ partial, long long n, int F, int O, long long row0, unsigned int s1,          \
      unsigned int s2, unsigned int p, float scale, int drop, const unsigned long long* seed_ptr,      \
      const float* __restrict__ row_scale) {                                                            \
    mgg_seed_from_device(seed_ptr, s1, s2);                                                             \
    dp_wgrad<OT, J>(x, G, mask, partial, n, F, O, row0, s1, s2, p, scale, drop, row_scale);            \
  }

DP_FWD_KERNEL(8)
DP_FWD_KERNEL(16)
DP_FWD_KERNEL(32)
DP_WGRAD_KERNEL(8, 1)
DP_WGRAD_KERNEL(16, 1)
DP_WGRAD_KERNEL(32, 1)
DP_WGRAD_KERNEL(8, 2)
DP_WGRAD_KERNEL(16, 2)
