// x W^T and G W for tall node matrices with narrow sides (mgg/kernels/tall_gemm.py, used by
// mgg.nn.dense and mgg.nn.norm_linear): Y [n, N] = X [n, K] B [K, N] (+ bias) (ReLU) with n in the
// millions, K <= 128 (K % 4 == 0) and N <= 64 (N even), and the weight gradient G^T X (both widths
// up to 64), in float32 values computed on TF32 tensor cores by the 3xTF32 split.
//
// Why: cuBLAS runs these float32 GEMMs on the SIMT units (FFMA): at [2.45M, 64] x [64, 64] one
// takes 0.67-0.69 ms on an H200, where reading and writing the rows once takes about 0.30 ms. A
// TF32 tensor-core product keeps only 10 mantissa bits (relative error 2e-4 to 3e-4 here). The
// 3xTF32 split keeps float32's: a = a_big + a_small with a_big = tf32(a), a_small = tf32(a -
// a_big) (about 21 bits together), and a b ~= a_small b_big + a_big b_small + a_big b_big (the
// a_small b_small term, below 2^-22 relative, is dropped), each on the tensor cores with float32
// accumulation: relative error 4e-7 to 5e-7 against float64, cuBLAS's float32 1e-7.
//
// Kernels (one job each)
//   mgg_tall_gemm_xb_kKC_nNT8   Y = X B (+ bias [N]) (ReLU); B any strides (W^T of a [N, K]
//                               weight for x W^T, the weight itself for the input gradient G W);
//                               KC = ceil(K / 16) in 1..4, NT8 = 2 ceil(N / 16) in 2, 4, 6, 8
//   mgg_tall_gemm_xbs_kKC_nNT8  the same, and it also writes each warp's column sums of
//                               (Y - shift) and (Y - shift)^2 (shift [N] or null: 0), float32
//                               [gridDim.x * XB_WARPS][2][N], for a batch norm reading Y (the
//                               caller adds the warps in float64; a shift near the mean keeps
//                               the variance from cancelling)
//   ..._kKC_nNT8_p2             xb / xbs for 64 < K <= 32 KC (KC = 3, 4): two passes over X's
//                               columns a tile, KC chunks each, the accumulators kept between
//                               them (a first layer's 100-wide input: at [2.45M, 100] -> 64 with
//                               the statistics 1.17 ms against cuBLAS + batch_norm_stats 1.23)
//   mgg_tall_gemm_xbp_kKC_nNT8  Y = relu(s X + o) B (+ bias) (ReLU), s, o [K] per column: a batch
//                               norm + ReLU of X applied to its values in registers as they are
//                               used (mgg.nn.norm_linear: the normalised X is never written)
//   mgg_tall_gemm_tn_kNT8       the weight gradient G^T X (below); tnp: X through relu(s X + o);
//                               tnm / tnpm: also G through a ReLU's backward (G' = G where M > 0,
//                               M the ReLU's output), G' written and its column sums per block
// Layout: X and Y contiguous row-major float32, X 16-byte aligned (K % 4 == 0: each row starts on
// 16 bytes), Y 8-byte aligned (N even).
// How (mma.sync.m16n8k8, X never staged in shared memory): lane (gid = lane / 4, tig = lane % 4)
// of a warp owning rows [r0, r0 + 32) loads, for each 16-column
// chunk c of X, the float4 X[r0 + 16 m + 8 h + gid][16 c + 4 tig .. + 3] (m, h in {0, 1}) straight
// into registers (each load instruction reads 64 contiguous bytes of 8 rows), the next tile's
// (or the next pass's) while it multiplies this one. The k order inside a chunk is permuted (a sum
// does not care): k-step 2c + e gives A slot tig the column 16 c + 4 tig + 2 e and slot tig + 4
// the next one, and B is laid out in shared memory to match, one float4 (big b0, big b1, small
// b0, small b1) per (k-step, n8 tile, lane): one conflict-free 16-byte load per fragment. The
// accumulators (2 m16 tiles x NT8 n8 tiles) are written to Y straight from registers (float2 per
// lane: each quad of lanes writes 32 contiguous bytes of a row), with the bias and the ReLU
// applied there. A prologue's map is applied when a chunk is used, not when it loads: an
// instruction on a value as it arrives would wait on the load and stop the prefetch (tnp with
// the map at load time took 0.67 ms a call against tn's 0.50; at use time 0.56, calls c1 and c2 in
// bench/results/2026-11-26-h200x1-d399e4f).
// Launch geometry: blockDim.x = 32 * XB_WARPS, grid-stride over 32-row tiles by warp (tile =
// blockIdx.x * XB_WARPS + warp); dynamic shared memory KC * NP * (2 * NT8 * 32 + (xbp: 8)) float4
// (B; xbp: s and o), filled once per block; about 250 registers a thread at KC = 4, NT8 = 8 (two
// tiles of X in flight), so 2 blocks a SM (the launcher's grid). xbs keeps each lane's column
// sums in registers over all its tiles and adds them over the warp once, at the end (adding them
// over the warp at every tile, through shared memory, made xbs 0.66 ms a call against 0.64).
#include <stdint.h>

#define XB_WARPS 4

__device__ __forceinline__ uint32_t tf32_bits(float v) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
  return r;
}

__device__ __forceinline__ void mma_tf32(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// a fragment's four values as TF32 big parts and TF32 small parts (v - big)
__device__ __forceinline__ void split4(const float (&v)[4], uint32_t (&big)[4], uint32_t (&small)[4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    big[q] = tf32_bits(v[q]);
    small[q] = tf32_bits(v[q] - __uint_as_float(big[q]));
  }
}

// acc += a b in 3xTF32, small terms first: a_small b_big + a_big b_small + a_big b_big
__device__ __forceinline__ void mma3(float* acc, const uint32_t (&ab)[4], const uint32_t (&as)[4], uint32_t bb0,
                                     uint32_t bb1, uint32_t bs0, uint32_t bs1) {
  mma_tf32(acc, as[0], as[1], as[2], as[3], bb0, bb1);
  mma_tf32(acc, ab[0], ab[1], ab[2], ab[3], bs0, bs1);
  mma_tf32(acc, ab[0], ab[1], ab[2], ab[3], bb0, bb1);
}

template <int KC>
__device__ __forceinline__ void xb_load(float4 (&a)[2][2][KC], const float* __restrict__ X, long long n, int K,
                                         long long r0, int col0, int gid, int tig) {
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const long long row = r0 + 16 * m + 8 * h + gid;
#pragma unroll
      for (int c = 0; c < KC; ++c) {
        const int col = col0 + 16 * c + 4 * tig;
        a[m][h][c] = (row < n && col < K) ? __ldcs(reinterpret_cast<const float4*>(X + row * K + col))
                                          : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
}

// relu(s v + o), componentwise: the prologue's batch norm + ReLU of an X value
__device__ __forceinline__ float4 affine_relu4(const float4& v, const float4& s, const float4& o) {
  return make_float4(fmaxf(fmaf(v.x, s.x, o.x), 0.f), fmaxf(fmaf(v.y, s.y, o.y), 0.f),
                     fmaxf(fmaf(v.z, s.z, o.z), 0.f), fmaxf(fmaf(v.w, s.w, o.w), 0.f));
}

// the accumulators of 2 m16 tiles x NT8 n8 tiles, to 0
template <int NT8>
__device__ __forceinline__ void zero_acc(float (&acc)[2][NT8][4]) {
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int j = 0; j < NT8; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[m][j][q] = 0.f;
}

// KC 16-column chunks of X a pass, NP passes a tile (K <= 16 KC NP); PRO: X's values go through
// relu(pro_s[k] x + pro_o[k]) as they are used (a batch norm + ReLU in the prologue)
template <int KC, int NP, int NT8, bool STATS, bool PRO>
__device__ __forceinline__ void tall_gemm_xb(const float* __restrict__ X, long long n, int K,
                                              const float* __restrict__ B, long long sbk, long long sbn, int N,
                                              const float* __restrict__ bias, float* __restrict__ Y, int relu,
                                              const float* __restrict__ shift, float* __restrict__ stats,
                                              const float* __restrict__ pro_s, const float* __restrict__ pro_o) {
  constexpr int CH = KC * NP;                    // chunks of B in shared memory
  extern __shared__ __align__(128) float4 bs[];  // [CH][2][NT8][32], then (PRO) scale and offset [CH * 4] each
  float4* const ps = bs + CH * 2 * NT8 * 32;     // PRO: float4 (16 c + 4 tig .. + 3) at [4 c + tig]
  float4* const po = ps + CH * 4;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
  // this lane's running column sums over its rows of every tile (cols 8 j + 2 tig, + 1): of
  // y - shift and of its square, for each of the two; added over the warp once, at the end
  float csum[NT8][4];
#pragma unroll
  for (int j = 0; j < NT8; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) csum[j][q] = 0.f;
  const long long tiles = (n + 31) >> 5, stride = (long long)gridDim.x * XB_WARPS;
  long long t = (long long)blockIdx.x * XB_WARPS + warp;
  int p = 0;  // this step's pass over the tile's columns [16 KC p, 16 KC (p + 1))
  float4 a[2][2][KC];
  if (t < tiles) xb_load<KC>(a, X, n, K, t << 5, 0, gid, tig);

  for (int i = threadIdx.x; i < CH * 2 * NT8 * 32; i += blockDim.x) {
    const int l = i & 31, j = (i >> 5) % NT8, se = (i >> 5) / NT8;  // se = 2 c + e
    const int k0 = 16 * (se >> 1) + 4 * (l & 3) + 2 * (se & 1), col = 8 * j + (l >> 2);
    const float v0 = (k0 < K && col < N) ? B[k0 * sbk + col * sbn] : 0.f;
    const float v1 = (k0 + 1 < K && col < N) ? B[(k0 + 1) * sbk + col * sbn] : 0.f;
    const float g0 = __uint_as_float(tf32_bits(v0)), g1 = __uint_as_float(tf32_bits(v1));
    bs[i] = make_float4(g0, g1, __uint_as_float(tf32_bits(v0 - g0)), __uint_as_float(tf32_bits(v1 - g1)));
  }
  if (PRO) {
    float* const psf = reinterpret_cast<float*>(ps);
    float* const pof = reinterpret_cast<float*>(po);
    for (int k = threadIdx.x; k < CH * 16; k += blockDim.x) {
      psf[k] = k < K ? pro_s[k] : 0.f;  // columns past K: relu(0 x + 0) = 0
      pof[k] = k < K ? pro_o[k] : 0.f;
    }
  }
  __syncthreads();

  float acc[2][NT8][4];
  zero_acc<NT8>(acc);
  while (t < tiles) {
    // the next step: this tile's next pass, or the first pass of the warp's next tile
    const bool lastp = p == NP - 1;
    const long long tn = lastp ? t + stride : t;
    const int pn = lastp ? 0 : p + 1;
    const bool more = tn < tiles;
    float4 an[2][2][KC];
    if (more) xb_load<KC>(an, X, n, K, tn << 5, 16 * KC * pn, gid, tig);
#pragma unroll
    for (int c = 0; c < KC; ++c) {
      const int cc = KC * p + c;  // the chunk of B
      if (NP > 1 && 16 * cc >= K) continue;  // a second pass's chunks past K: zeros, no products
      if (PRO) {
        const float4 s = ps[4 * cc + tig], o = po[4 * cc + tig];
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int h = 0; h < 2; ++h) a[m][h][c] = affine_relu4(a[m][h][c], s, o);
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        uint32_t ab[2][4], as[2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          // slots: a0 (gid, tig), a1 (gid + 8, tig), a2 (gid, tig + 4), a3 (gid + 8, tig + 4)
          const float v[4] = {e ? a[m][0][c].z : a[m][0][c].x, e ? a[m][1][c].z : a[m][1][c].x,
                              e ? a[m][0][c].w : a[m][0][c].y, e ? a[m][1][c].w : a[m][1][c].y};
          split4(v, ab[m], as[m]);
        }
#pragma unroll
        for (int j = 0; j < NT8; ++j) {
          const float4 b = bs[((2 * cc + e) * NT8 + j) * 32 + lane];
          const uint32_t bb0 = __float_as_uint(b.x), bb1 = __float_as_uint(b.y);
          const uint32_t bs0 = __float_as_uint(b.z), bs1 = __float_as_uint(b.w);
#pragma unroll
          for (int m = 0; m < 2; ++m) mma3(acc[m][j], ab[m], as[m], bb0, bb1, bs0, bs1);
        }
      }
    }
    if (lastp) {
      // c0, c1: (row gid, cols 8 j + 2 tig, + 1); c2, c3: (row gid + 8, the same cols)
      const long long r0 = t << 5;
      const bool pairs = (N & 1) == 0;
#pragma unroll
      for (int j = 0; j < NT8; ++j) {
        const int col = 8 * j + 2 * tig;
        if (col >= N) continue;
        const float b0 = bias ? bias[col] : 0.f;
        const float b1 = (bias && col + 1 < N) ? bias[col + 1] : 0.f;
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const long long row = r0 + 16 * m + 8 * h + gid;
            if (row >= n) continue;
            float v0 = acc[m][j][2 * h] + b0, v1 = acc[m][j][2 * h + 1] + b1;
            if (relu) { v0 = fmaxf(v0, 0.f); v1 = fmaxf(v1, 0.f); }
            if (pairs) {
              __stcs(reinterpret_cast<float2*>(Y + row * N + col), make_float2(v0, v1));
            } else {
              __stcs(Y + row * N + col, v0);
              if (col + 1 < N) __stcs(Y + row * N + col + 1, v1);
            }
          }
      }
      if (STATS) {  // the tile's column sums of (y - shift) and (y - shift)^2, y as written
#pragma unroll
        for (int j = 0; j < NT8; ++j) {
          const int col = 8 * j + 2 * tig;
          const bool c0ok = col < N, c1ok = col + 1 < N;
          const float b0 = (bias && c0ok) ? bias[col] : 0.f, b1 = (bias && c1ok) ? bias[col + 1] : 0.f;
          const float z0 = (shift && c0ok) ? shift[col] : 0.f, z1 = (shift && c1ok) ? shift[col + 1] : 0.f;
          float s0 = 0.f, s1 = 0.f, q0 = 0.f, q1 = 0.f;
#pragma unroll
          for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              if (r0 + 16 * m + 8 * h + gid >= n) continue;
              float v0 = acc[m][j][2 * h] + b0, v1 = acc[m][j][2 * h + 1] + b1;
              if (relu) { v0 = fmaxf(v0, 0.f); v1 = fmaxf(v1, 0.f); }
              const float d0 = v0 - z0, d1 = v1 - z1;
              s0 += d0; s1 += d1; q0 += d0 * d0; q1 += d1 * d1;
            }
          csum[j][0] += s0; csum[j][1] += s1; csum[j][2] += q0; csum[j][3] += q1;
        }
      }
      zero_acc<NT8>(acc);
    }
    if (more) {
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int c = 0; c < KC; ++c) a[m][h][c] = an[m][h][c];
    }
    t = tn;
    p = pn;
  }
  if (STATS) {  // the warp's sums into stats[blockIdx.x * XB_WARPS + warp][2][N]
    float* out = stats + ((long long)blockIdx.x * XB_WARPS + warp) * 2 * N;
#pragma unroll
    for (int j = 0; j < NT8; ++j) {
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int o = 4; o < 32; o <<= 1)  // over the 8 lanes of this tig (gid = 0..7)
          csum[j][q] += __shfl_xor_sync(0xffffffffu, csum[j][q], o);
      const int col = 8 * j + 2 * tig;
      if (gid == 0 && col < N) {  // lanes 0..3 own distinct columns (N even: col + 1 < N too)
        out[col] = csum[j][0]; out[col + 1] = csum[j][1];
        out[N + col] = csum[j][2]; out[N + col + 1] = csum[j][3];
      }
    }
  }
}

// xb (plain), xbs (with the column statistics), xbp (the affine + ReLU prologue on X); the kernel
// names carry KC and NT8, and _p2 for two passes (64 < K <= 32 KC)
#define MGG_XB_NAMED(SUF, KC, NP, NT8)                                                                       \
  extern "C" __global__ void __launch_bounds__(32 * XB_WARPS) mgg_tall_gemm_xb_k##KC##_n##NT8##SUF(          \
      const float* __restrict__ X, long long n, int K, const float* __restrict__ B, long long sbk,            \
      long long sbn, int N, const float* __restrict__ bias, float* __restrict__ Y, int relu) {                \
    tall_gemm_xb<KC, NP, NT8, false, false>(X, n, K, B, sbk, sbn, N, bias, Y, relu, nullptr, nullptr,        \
                                            nullptr, nullptr);                                                \
  }                                                                                                           \
  extern "C" __global__ void __launch_bounds__(32 * XB_WARPS) mgg_tall_gemm_xbs_k##KC##_n##NT8##SUF(         \
      const float* __restrict__ X, long long n, int K, const float* __restrict__ B, long long sbk,            \
      long long sbn, int N, const float* __restrict__ bias, float* __restrict__ Y, int relu,                  \
      const float* __restrict__ shift, float* __restrict__ stats) {                                           \
    tall_gemm_xb<KC, NP, NT8, true, false>(X, n, K, B, sbk, sbn, N, bias, Y, relu, shift, stats, nullptr,    \
                                           nullptr);                                                          \
  }
#define MGG_XBP(KC, NT8)                                                                                     \
  extern "C" __global__ void __launch_bounds__(32 * XB_WARPS) mgg_tall_gemm_xbp_k##KC##_n##NT8(              \
      const float* __restrict__ X, long long n, int K, const float* __restrict__ B, long long sbk,            \
      long long sbn, int N, const float* __restrict__ bias, float* __restrict__ Y, int relu,                  \
      const float* __restrict__ pro_s, const float* __restrict__ pro_o) {                                     \
    tall_gemm_xb<KC, 1, NT8, false, true>(X, n, K, B, sbk, sbn, N, bias, Y, relu, nullptr, nullptr, pro_s,   \
                                          pro_o);                                                             \
  }
#define MGG_XB(KC, NT8) MGG_XB_NAMED(, KC, 1, NT8) MGG_XBP(KC, NT8)
#define MGG_XB_K(KC) MGG_XB(KC, 2) MGG_XB(KC, 4) MGG_XB(KC, 6) MGG_XB(KC, 8)
#define MGG_XB_K2(KC) MGG_XB_NAMED(_p2, KC, 2, 2) MGG_XB_NAMED(_p2, KC, 2, 4) MGG_XB_NAMED(_p2, KC, 2, 6) \
  MGG_XB_NAMED(_p2, KC, 2, 8)
// MGG_TALL_GEMM_PART=P: only the entry points of part P (1-4: the one-pass xb kernels of KC = P,
// those of NT8 = 8 apart for KC = 4; 5: the tn kernels; 6 and 7: the two-pass xb kernels of KC = 3
// and 4; 8: the one-pass xb kernels of KC = 4, NT8 = 8, the slowest to compile). The runtime builds
// the eight parts as separate cubins, in parallel (mgg.kernels.modules); undefined: every entry point.
#ifdef MGG_TALL_GEMM_PART
#define MGG_TG_HAS(P) (MGG_TALL_GEMM_PART == (P))
#pragma nv_diag_suppress 177  // helpers of the other parts go unreferenced in a part
#else
#define MGG_TG_HAS(P) 1
#endif
#if MGG_TG_HAS(1)
MGG_XB_K(1)
#endif
#if MGG_TG_HAS(2)
MGG_XB_K(2)
#endif
#if MGG_TG_HAS(3)
MGG_XB_K(3)
#endif
#if MGG_TG_HAS(4)
MGG_XB(4, 2) MGG_XB(4, 4) MGG_XB(4, 6)
#endif
#if MGG_TG_HAS(8)
MGG_XB(4, 8)
#endif
#if MGG_TG_HAS(6)
MGG_XB_K2(3)
#endif
#if MGG_TG_HAS(7)
MGG_XB_K2(4)
#endif

// ---- mgg_tall_gemm_tn_kNT8: P [block] = G^T X over the block's rows, G [n, N], X [n, K] ----
// The weight gradient G^T x of a tall G and x (N, K multiples of 4 up to 64): a reduction over n.
// The caller sums the per-block partial matrices P [gridDim.x, N, K] in a fixed order.
// How: a block is HALVES warps; warp h owns G's columns [32 h, 32 h + 32) (two m16 tiles of the
// output) and all of X's; the block walks chunks of 128 rows (chunk = blockIdx.x, += gridDim.x),
// 8 rows an mma k-step. Rows and columns are permuted so that every lane loads whole float4s:
// k slot tig <-> row 2 tig, slot tig + 4 <-> row 2 tig + 1 of the step (a sum over rows does not
// care), output row pi(mt, gid) = 32 h + 4 gid + 2 mt (gid + 8: + 1) and output column
// sigma(j, jj) = NT8 jj + j, undone when the sums are written. Each chunk's products are summed on
// the tensor cores from zero and then added to the warp's totals in float32 registers: tensor-core
// accumulation does not round to nearest, and over millions of rows its error grew to 6e-5
// (relative) where these adds keep it at float32's. The next step's rows are loaded while the
// tensor cores work on this one.
// Launch geometry: blockDim.x = 32 * HALVES (HALVES = 2 when N > 32), any gridDim.x; no shared
// memory.
#define TN_CHUNK_STEPS 16  // 128 rows a chunk

template <int NT8, bool GM>
struct TnRows {  // one k-step's loads of a lane: G (and GM: the ReLU output M) and X at rows 2 tig, 2 tig + 1
  float4 g[2];
  float4 mk[GM ? 2 : 1];
  float4 x[2][NT8 / 4 > 0 ? NT8 / 4 : 1];
};

template <int NT8, bool GM>
__device__ __forceinline__ void tn_load(TnRows<NT8, GM>& v, const float* __restrict__ G, const float* __restrict__ M,
                                        const float* __restrict__ X, long long n, int N, int K, long long r, int gcol,
                                        int xcol) {
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const long long row = r + q;
    const bool ok = row < n;
    v.g[q] = (ok && gcol < N) ? __ldcs(reinterpret_cast<const float4*>(G + row * N + gcol))
                              : make_float4(0.f, 0.f, 0.f, 0.f);
    if (GM)
      v.mk[q] = (ok && gcol < N) ? __ldcs(reinterpret_cast<const float4*>(M + row * N + gcol))
                                 : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int u = 0; u < (NT8 >= 4 ? NT8 / 4 : 1); ++u) {
      const int c = xcol + 4 * u;
      if (NT8 >= 4)
        v.x[q][u] = (ok && c < K) ? __ldcs(reinterpret_cast<const float4*>(X + row * K + c))
                                  : make_float4(0.f, 0.f, 0.f, 0.f);
      else  // NT8 == 2: a float2 (K <= 16)
        v.x[q][u] = (ok && c < K) ? [&] { const float2 t = __ldcs(reinterpret_cast<const float2*>(X + row * K + c));
                                          return make_float4(t.x, t.y, 0.f, 0.f); }()
                                  : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
}

__device__ __forceinline__ float f4(const float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

__device__ __forceinline__ float4 relu_mask4(const float4& g, const float4& m) {
  return make_float4(m.x > 0.f ? g.x : 0.f, m.y > 0.f ? g.y : 0.f, m.z > 0.f ? g.z : 0.f, m.w > 0.f ? g.w : 0.f);
}

// PRO: X's values through relu(pro_s x + pro_o). GM: G is the gradient of a ReLU's output M: the
// kernel uses G' = G where M > 0 (else 0), writes G' to Gout and each block's column sums of G'
// to gsum [gridDim.x, N] (the bias gradient of the Linear before the ReLU).
template <int NT8, bool PRO, bool GM>
__device__ __forceinline__ void tall_gemm_tn(const float* __restrict__ G, const float* __restrict__ X, long long n,
                                             int N, int K, float* __restrict__ partial,
                                             const float* __restrict__ pro_s, const float* __restrict__ pro_o,
                                             const float* __restrict__ M, float* __restrict__ Gout,
                                             float* __restrict__ gsum) {
  const int half = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
  const int gcol = 32 * half + 4 * gid, xcol = NT8 * gid;
  constexpr int XU = NT8 / 4 > 0 ? NT8 / 4 : 1;
  float4 ps[XU], po[XU];  // PRO: relu(s x + o) of this lane's X columns (0 past K)
#pragma unroll
  for (int u = 0; u < XU; ++u) {
    float sv[4], ov[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int c = xcol + 4 * u + q;
      sv[q] = (PRO && c < K) ? pro_s[c] : 0.f;
      ov[q] = (PRO && c < K) ? pro_o[c] : 0.f;
    }
    ps[u] = make_float4(sv[0], sv[1], sv[2], sv[3]);
    po[u] = make_float4(ov[0], ov[1], ov[2], ov[3]);
  }
  float4 csum = make_float4(0.f, 0.f, 0.f, 0.f);  // GM: this lane's sums of G' (cols gcol .. + 3)
  float total[2][NT8][4], acc[2][NT8][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int j = 0; j < NT8; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) total[m][j][q] = acc[m][j][q] = 0.f;
  const long long chunks = (n + 8 * TN_CHUNK_STEPS - 1) / (8 * TN_CHUNK_STEPS);
  long long ch = blockIdx.x;
  int s = 0;
  TnRows<NT8, GM> cur;
  long long r = ch * 8 * TN_CHUNK_STEPS + 2 * tig;  // cur's first row
  if (ch < chunks) tn_load<NT8, GM>(cur, G, M, X, n, N, K, r, gcol, xcol);
  while (ch < chunks) {
    // the next step's rows: the next 8 of this chunk, or the first 8 of the block's next chunk
    const bool last = s == TN_CHUNK_STEPS - 1;
    const long long nch = last ? ch + gridDim.x : ch;
    const int ns = last ? 0 : s + 1;
    TnRows<NT8, GM> nxt;
    const long long nr = nch * 8 * TN_CHUNK_STEPS + 8 * ns + 2 * tig;
    if (nch < chunks) tn_load<NT8, GM>(nxt, G, M, X, n, N, K, nr, gcol, xcol);
    if (GM) {  // the ReLU's mask as the values are used; G' written and summed (rows past n are 0)
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        cur.g[q] = relu_mask4(cur.g[q], cur.mk[q]);
        if (r + q < n && gcol < N) __stcs(reinterpret_cast<float4*>(Gout + (r + q) * N + gcol), cur.g[q]);
        csum.x += cur.g[q].x; csum.y += cur.g[q].y; csum.z += cur.g[q].z; csum.w += cur.g[q].w;
      }
    }
    uint32_t ab[2][4], as[2][4];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      // a0 (i gid, slot tig), a1 (gid + 8, tig), a2 (gid, tig + 4), a3 (gid + 8, tig + 4)
      const float v[4] = {m ? cur.g[0].z : cur.g[0].x, m ? cur.g[0].w : cur.g[0].y,
                          m ? cur.g[1].z : cur.g[1].x, m ? cur.g[1].w : cur.g[1].y};
      split4(v, ab[m], as[m]);
    }
#pragma unroll
    for (int j = 0; j < NT8; ++j) {
      float x0 = f4(cur.x[0][j / 4], j % 4), x1 = f4(cur.x[1][j / 4], j % 4);
      if (PRO) {  // as the values are used, not as they load (the loads stay in flight); a row
                  // past n is 0 in G, so whatever the map makes of it adds nothing
        const float sj = f4(ps[j / 4], j % 4), oj = f4(po[j / 4], j % 4);
        x0 = fmaxf(fmaf(x0, sj, oj), 0.f);
        x1 = fmaxf(fmaf(x1, sj, oj), 0.f);
      }
      const uint32_t bb0 = tf32_bits(x0), bb1 = tf32_bits(x1);
      const uint32_t bs0 = tf32_bits(x0 - __uint_as_float(bb0)), bs1 = tf32_bits(x1 - __uint_as_float(bb1));
#pragma unroll
      for (int m = 0; m < 2; ++m) mma3(acc[m][j], ab[m], as[m], bb0, bb1, bs0, bs1);
    }
    if (last) {
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < NT8; ++j)
#pragma unroll
          for (int q = 0; q < 4; ++q) { total[m][j][q] += acc[m][j][q]; acc[m][j][q] = 0.f; }
    }
    ch = nch; s = ns; cur = nxt; r = nr;
  }
  if (GM) {  // the block's column sums of G': over the 4 lanes of a gid (rows 2 tig, + 1), then the warp
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {
      csum.x += __shfl_xor_sync(0xffffffffu, csum.x, o); csum.y += __shfl_xor_sync(0xffffffffu, csum.y, o);
      csum.z += __shfl_xor_sync(0xffffffffu, csum.z, o); csum.w += __shfl_xor_sync(0xffffffffu, csum.w, o);
    }
    if (tig == 0 && gcol < N) *reinterpret_cast<float4*>(gsum + (long long)blockIdx.x * N + gcol) = csum;
  }
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int j = 0; j < NT8; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) total[m][j][q] += acc[m][j][q];  // a partial last chunk
  // c0 (i gid, jj 2 tig), c1 (gid, 2 tig + 1), c2 (gid + 8, 2 tig), c3 (gid + 8, 2 tig + 1)
  float* out = partial + (long long)blockIdx.x * N * K;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int j = 0; j < NT8; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int row = 32 * half + 4 * gid + 2 * m + (q >> 1), col = NT8 * (2 * tig + (q & 1)) + j;
        if (row < N && col < K) out[row * K + col] = total[m][j][q];
      }
}

// tn: plain; tnp: X through the prologue relu(pro_s x + pro_o), applied as the values are used;
// tnm / tnpm: also G through the ReLU's backward (G' = G where M > 0), G' written and summed
// (G' float4 per lane and row, each element by one lane; gsum [gridDim.x, N]: the caller adds
// the blocks' sums in a fixed order). This replaces a pass that reads G and M and writes G'
// (mgg/kernels/relu_grad.cu) before the GEMM reads G': 0.864 ms against 1.030 (c2 above).
#define MGG_TN_NAMED(NAME, NT8, PRO, GM)                                                                     \
  extern "C" __global__ void __launch_bounds__(64) NAME(                                                      \
      const float* __restrict__ G, const float* __restrict__ X, long long n, int N, int K,                    \
      float* __restrict__ partial, const float* __restrict__ pro_s, const float* __restrict__ pro_o,          \
      const float* __restrict__ M, float* __restrict__ Gout, float* __restrict__ gsum) {                     \
    tall_gemm_tn<NT8, PRO, GM>(G, X, n, N, K, partial, pro_s, pro_o, M, Gout, gsum);                        \
  }
#define MGG_TN(NT8)                                            \
  MGG_TN_NAMED(mgg_tall_gemm_tn_k##NT8, NT8, false, false)     \
  MGG_TN_NAMED(mgg_tall_gemm_tnp_k##NT8, NT8, true, false)     \
  MGG_TN_NAMED(mgg_tall_gemm_tnm_k##NT8, NT8, false, true)     \
  MGG_TN_NAMED(mgg_tall_gemm_tnpm_k##NT8, NT8, true, true)
#if MGG_TG_HAS(5)
MGG_TN(2)
MGG_TN(4)
MGG_TN(8)
#endif
