// Tall-skinny projection with the hash dropout fused in: out = dropout(x) @ W^T, and its weight
// gradient grad_W = dropout(x)^T @ G, for x float32 [n, F] with n in the millions, F <= 256
// (F % 4 == 0) and O <= 32 outputs. The dropped x is never written: each kernel regenerates
// the keep decision of (global row row0 + r, column c) from the seed, bit for bit the one of
// mgg/kernels/dropout.cu and mgg.nn.functional.hash_uniform:
//     h_row = lowbias32((row & 0xffffffff) ^ s1); u = (lowbias32(h_row ^ (c * 0x9E3779B1 + s2)) >> 8) / 2^24
//     x'[r, c] = (x[r, c] * (u >= p ? 1 : 0)) * scale          (dropout = 0: x' = x)
// (the kernels take p as the integer threshold ceil(p 2^24) of h >> 8, the same decision)
//
// Kernels (one warp per row, grid-stride over rows; lane l owns columns 4l + 128j, j < J)
//   mgg_dp_fwd_o{OT}_j{J}    out[r, o] = sum_c x'[r, c] W[o, c], 4 / J rows in flight per warp. A
//                            lane keeps its 4 J columns of W^T in registers, multiplies its
//                            float4(s) of the row into OT partial sums and the warp reduces them
//                            by a halving butterfly (OT - 1 + log2(32 / OT) shuffles), after
//                            which lane l holds output (l >> (5 - log2 OT)); the first lane of
//                            each such group writes it.
//   mgg_dp_wgrad_o{OT}_j{J}  partial[w, c, o] = sum over warp w's rows of x'[r, c] G[r, o], 2 / J
//                            rows in flight: a lane accumulates its 4 J x OT products in
//                            registers, then writes them; the caller sums the [warps, F, O]
//                            partials (a fixed order: deterministic).
// Launch geometry: blockDim.x = 32 * WPB (any WPB), gridDim.x = blocks (the launcher picks a few
// per SM); no shared memory. x, out, G contiguous row-major; W [O, F] row-major; 16-byte aligned
// x (and G when O % 4 == 0). OT is O rounded up to 8, 16 or 32 (outputs >= O are not written); J = ceil(F / 128) <= 2,
// and OT * J <= 32 (the per-lane register arrays hold 4 * J * OT floats; no spills at sm_90).
#include <stdint.h>

__device__ __forceinline__ uint32_t dp_lowbias32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// u >= p with u = (h >> 8) / 2^24 exactly (a 24-bit integer over 2^24) is (h >> 8) >= ceil(p 2^24):
// the launcher passes that threshold, and the compare stays integer (no int -> float convert)
__device__ __forceinline__ float dp_keep(uint32_t h_row, uint32_t col, uint32_t s2, uint32_t thresh) {
  const uint32_t h = dp_lowbias32(h_row ^ (col * 0x9E3779B1u + s2));
  return (h >> 8) >= thresh ? 1.0f : 0.0f;
}

// x'[r, c0 .. c0 + 3] (zeros past F)
__device__ __forceinline__ float4 dp_load(const float* __restrict__ x, long long r, int F, int c0, int drop,
                                          uint32_t h_row, uint32_t s2, uint32_t p, float scale) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (c0 < F) {
    v = *reinterpret_cast<const float4*>(x + r * F + c0);
    if (drop) {
      v.x = (v.x * dp_keep(h_row, (uint32_t)c0 + 0, s2, p)) * scale;
      v.y = (v.y * dp_keep(h_row, (uint32_t)c0 + 1, s2, p)) * scale;
      v.z = (v.z * dp_keep(h_row, (uint32_t)c0 + 2, s2, p)) * scale;
      v.w = (v.w * dp_keep(h_row, (uint32_t)c0 + 3, s2, p)) * scale;
    }
  }
  return v;
}

template <int OT, int J>
__device__ void dp_fwd(const float* __restrict__ x, const float* __restrict__ W, float* __restrict__ out,
                       long long n, int F, int O, long long row0, uint32_t s1, uint32_t s2, uint32_t p,
                       float scale, int drop) {
  const int lane = threadIdx.x & 31;
  float w[J][4][OT];  // this lane's columns of W^T
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int o = 0; o < OT; ++o) {
        const int c = 4 * lane + 128 * j + k;
        w[j][k][o] = (c < F && o < O) ? W[(long long)o * F + c] : 0.f;
      }
  const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
  constexpr int LOG = OT == 8 ? 3 : (OT == 16 ? 4 : 5);
  constexpr int R = J == 1 ? 4 : 2;  // rows in flight per warp: their loads are issued together
  for (long long r0 = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r0 < n; r0 += R * warps) {
    float4 v[R][J];
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const long long r = r0 + q * warps;
      const uint32_t h_row = dp_lowbias32((uint32_t)((unsigned long long)(row0 + r) & 0xffffffffull) ^ s1);
#pragma unroll
      for (int j = 0; j < J; ++j)
        v[q][j] = r < n ? dp_load(x, r, F, 4 * lane + 128 * j, drop, h_row, s2, p, scale)
                        : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const long long r = r0 + q * warps;
      float acc[OT];
#pragma unroll
      for (int o = 0; o < OT; ++o) acc[o] = 0.f;
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int o = 0; o < OT; ++o)
          acc[o] += v[q][j].x * w[j][0][o] + v[q][j].y * w[j][1][o] + v[q][j].z * w[j][2][o] + v[q][j].w * w[j][3][o];
      // halving butterfly: at offset `off` a lane keeps the half of its values its bit selects
      int m = OT;
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1) {
        if (m > 1) {
          const bool upper = (lane & off) != 0;
          const int half = m >> 1;
#pragma unroll
          for (int i = 0; i < OT / 2; ++i) {
            if (i < half) {
              const float send = upper ? acc[i] : acc[i + half];
              const float mine = upper ? acc[i + half] : acc[i];
              acc[i] = mine + __shfl_xor_sync(0xffffffffu, send, off);
            }
          }
          m = half;
        } else {
          acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], off);
        }
      }
      const int o = (lane >> (5 - LOG)) & (OT - 1);
      if (r < n && (lane & ((32 >> LOG) - 1)) == 0 && o < O) out[r * O + o] = acc[0];
    }
  }
}

template <int OT, int J>
__device__ void dp_wgrad(const float* __restrict__ x, const float* __restrict__ G, float* __restrict__ partial,
                         long long n, int F, int O, long long row0, uint32_t s1, uint32_t s2, uint32_t p,
                         float scale, int drop) {
  const int lane = threadIdx.x & 31;
  float acc[J][4][OT];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int o = 0; o < OT; ++o) acc[j][k][o] = 0.f;
  const long long wid = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
  constexpr int R = J == 1 ? 2 : 1;  // rows in flight per warp
  for (long long r0 = wid; r0 < n; r0 += R * warps) {
    float4 v[R][J];
    float g[R][OT];
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const long long r = r0 + q * warps;
      const bool in = r < n;
      const uint32_t h_row = dp_lowbias32((uint32_t)((unsigned long long)(row0 + r) & 0xffffffffull) ^ s1);
      if (in && (O & 3) == 0) {  // the row of G as float4s (every lane reads it: a broadcast)
#pragma unroll
        for (int o = 0; o < OT; o += 4) {
          const float4 t = o < O ? *reinterpret_cast<const float4*>(G + r * O + o) : make_float4(0.f, 0.f, 0.f, 0.f);
          g[q][o] = t.x; g[q][o + 1] = t.y; g[q][o + 2] = t.z; g[q][o + 3] = t.w;
        }
      } else {
#pragma unroll
        for (int o = 0; o < OT; ++o) g[q][o] = (in && o < O) ? G[r * O + o] : 0.f;
      }
#pragma unroll
      for (int j = 0; j < J; ++j)
        v[q][j] = in ? dp_load(x, r, F, 4 * lane + 128 * j, drop, h_row, s2, p, scale)
                     : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int q = 0; q < R; ++q)
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int o = 0; o < OT; ++o) {
          acc[j][0][o] += v[q][j].x * g[q][o];
          acc[j][1][o] += v[q][j].y * g[q][o];
          acc[j][2][o] += v[q][j].z * g[q][o];
          acc[j][3][o] += v[q][j].w * g[q][o];
        }
  }
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

#define DP_KERNELS(OT, J)                                                                              \
  extern "C" __global__ void mgg_dp_fwd_o##OT##_j##J(                                                  \
      const float* __restrict__ x, const float* __restrict__ W, float* __restrict__ out, long long n,   \
      int F, int O, long long row0, unsigned int s1, unsigned int s2, unsigned int p, float scale, int drop) { \
    dp_fwd<OT, J>(x, W, out, n, F, O, row0, s1, s2, p, scale, drop);                                   \
  }                                                                                                    \
  extern "C" __global__ void mgg_dp_wgrad_o##OT##_j##J(                                                \
      const float* __restrict__ x, const float* __restrict__ G, float* __restrict__ partial,            \
      long long n, int F, int O, long long row0, unsigned int s1, unsigned int s2, unsigned int p,             \
      float scale, int drop) {                                                                         \
    dp_wgrad<OT, J>(x, G, partial, n, F, O, row0, s1, s2, p, scale, drop);                             \
  }

DP_KERNELS(8, 1)
DP_KERNELS(16, 1)
DP_KERNELS(32, 1)
DP_KERNELS(8, 2)
DP_KERNELS(16, 2)

