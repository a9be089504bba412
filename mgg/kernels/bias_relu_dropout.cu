// A hidden GCN layer's epilogue in one pass each way (mgg/kernels/bias_relu_dropout.py, used by
// mgg.nn.epilogue): the aggregation's output a, plus the bias, through the ReLU, then the next
// layer's input dropout and its per-row input scale (the gcn column factor it folds in).
//
//   forward   y = relu(a + b); out = ((y * keep) * scale) * rs        [n, D] -> [n, D]
//   backward  g' = ((g * keep) * scale) * rs, masked where a + b <= 0;
//             db = the column sums of g'; gout = g' * f                  [n, D] -> [n, D], [D]
//
// Without the fusion these are five passes over [n, D] forward-and-back that torch and mgg's own
// kernels run one by one: the bias add, the ReLU and the dropout forward; the dropout backward,
// threshold_backward, the bias gradient's sum and the transposed aggregation's pre-scale pass (f,
// its column factor: gout is the table that aggregation takes as scaled_input) backward. Each
// value is computed with the same float32 operations in the same order as that chain, so out and
// gout are the same bits; db is summed in another order (block_colsum.cuh).
//   keep: mgg_keep_factor (dropout_hash.cuh) of (global row row0 + r, column c) when `drop`, else
//         1 with scale 1 (no dropout: eval, p = 0, or the next layer drops inside its projection);
//   rs:   row_scale[r] when row_scale is not null, else 1;  b: bias[c] when not null, else none
//         (no add);  f: out_scale[r] when not null, else 1.
// The ReLU is torch's: a + b <= 0 gives 0 (a NaN passes through, forward and backward).
//
// Kernels
//   mgg_brd_forward    (a) -> out
//   mgg_brd_backward   (g, a) -> gout and per-block partial column sums float32 [gridDim.x, D]
// Layout: a, out, g, gout contiguous row-major float32 [n, D], 16-byte aligned, D = 4 * d4 with d4
// = 2^d4_log2 <= 256. One thread handles one float4 (4 columns of a row) at a time.
// Launch geometry: blockDim.x = MGG_BRD_THREADS (256), any gridDim.x; a thread strides by
// gridDim.x * 256 float4s, a multiple of d4, so it always sees the same 4 columns (its bias in
// registers, its column sums too). Static shared memory: the backward's 4 * 256 floats.
#include <stdint.h>

#include "block_colsum.cuh"
#include "dropout_hash.cuh"

#define MGG_BRD_THREADS 256

// ((v * keep) * scale) * rs of 4 values of columns c0 .. c0 + 3 of the row hashed to h_row
__device__ __forceinline__ float4 brd_drop(float4 v, bool drop, uint32_t h_row, uint32_t c0, uint32_t s2, float p,
                                           float scale, const float* __restrict__ row_scale, long long r) {
  if (drop) {
    v.x = (v.x * mgg_keep_factor(h_row, c0 + 0, s2, p)) * scale;
    v.y = (v.y * mgg_keep_factor(h_row, c0 + 1, s2, p)) * scale;
    v.z = (v.z * mgg_keep_factor(h_row, c0 + 2, s2, p)) * scale;
    v.w = (v.w * mgg_keep_factor(h_row, c0 + 3, s2, p)) * scale;
  }
  if (row_scale) {
    const float rs = __ldg(row_scale + r);
    v.x *= rs; v.y *= rs; v.z *= rs; v.w *= rs;
  }
  return v;
}

__device__ __forceinline__ float4 brd_pre(float4 a, bool has_bias, float4 b) {
  if (has_bias) { a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w; }
  return a;
}

__device__ __forceinline__ float brd_relu(float t) { return t <= 0.f ? 0.f : t; }

extern "C" __global__ void mgg_brd_forward(const float4* __restrict__ a, const float4* __restrict__ bias,
                                           float4* __restrict__ out, long long n4, int d4_log2, long long row0,
                                           unsigned int s1, unsigned int s2, float p, float scale, int drop,
                                           const unsigned long long* __restrict__ seed_ptr,
                                           const float* __restrict__ row_scale) {
  if (drop) mgg_seed_from_device(seed_ptr, s1, s2);
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  const int c4 = (int)(first & ((1 << d4_log2) - 1));
  const float4 b = bias ? __ldg(bias + c4) : make_float4(0.f, 0.f, 0.f, 0.f);
  for (long long t = first; t < n4; t += stride) {
    const long long r = t >> d4_log2;
    float4 v = brd_pre(__ldcs(a + t), bias != nullptr, b);
    v = make_float4(brd_relu(v.x), brd_relu(v.y), brd_relu(v.z), brd_relu(v.w));
    const uint32_t h_row = drop ? mgg_lowbias32((uint32_t)((unsigned long long)(row0 + r) & 0xffffffffull) ^ s1) : 0u;
    out[t] = brd_drop(v, drop, h_row, 4u * (uint32_t)c4, s2, p, scale, row_scale, r);
  }
}

extern "C" __global__ void mgg_brd_backward(const float4* __restrict__ g, const float4* __restrict__ a,
                                            const float4* __restrict__ bias, float4* __restrict__ gout,
                                            float* __restrict__ partial, long long n4, int d4_log2, long long row0,
                                            unsigned int s1, unsigned int s2, float p, float scale, int drop,
                                            const unsigned long long* __restrict__ seed_ptr,
                                            const float* __restrict__ row_scale, const float* __restrict__ out_scale) {
  if (drop) mgg_seed_from_device(seed_ptr, s1, s2);
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  const int c4 = (int)(first & ((1 << d4_log2) - 1));
  const float4 b = bias ? __ldg(bias + c4) : make_float4(0.f, 0.f, 0.f, 0.f);
  float s[4] = {0.f, 0.f, 0.f, 0.f};
  for (long long t = first; t < n4; t += stride) {
    const long long r = t >> d4_log2;
    const uint32_t h_row = drop ? mgg_lowbias32((uint32_t)((unsigned long long)(row0 + r) & 0xffffffffull) ^ s1) : 0u;
    const float4 gv = brd_drop(__ldcs(g + t), drop, h_row, 4u * (uint32_t)c4, s2, p, scale, row_scale, r);
    const float4 v = brd_pre(__ldcs(a + t), bias != nullptr, b);
    float4 o = make_float4(v.x <= 0.f ? 0.f : gv.x, v.y <= 0.f ? 0.f : gv.y, v.z <= 0.f ? 0.f : gv.z,
                           v.w <= 0.f ? 0.f : gv.w);
    s[0] += o.x; s[1] += o.y; s[2] += o.z; s[3] += o.w;
    if (out_scale) {
      const float f = __ldg(out_scale + r);
      o.x *= f; o.y *= f; o.z *= f; o.w *= f;
    }
    gout[t] = o;  // a plain store: the part of gout that stays in the L2 serves the aggregation next
  }
  mgg_block_colsum<MGG_BRD_THREADS>(s, 1 << d4_log2, partial);
}
