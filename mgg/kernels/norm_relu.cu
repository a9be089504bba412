// Batch norm's per-column transform fused with the ReLU that follows it (GIN's MLP: Linear ->
// BatchNorm -> ReLU -> Linear), forward and backward, so neither the normalised rows nor the
// ReLU's mask is written or read back.
//
//   forward   y  = max(0, t),  t = w[c] (x - mean[c]) invstd[c] + b[c]   (torch's batch_norm_elemt
//                                                                         expression, then ReLU)
//   backward  dy' = t > 0 ? dy : 0                (t recomputed from x by the same bn_affine)
//             sum_dy[c] = sum_rows dy',  sum_dy_xmu[c] = sum_rows dy' (x - mean[c])
//             dx = (dy' - sum_dy / N - (x - mean) sum_dy_xmu / N invstd^2) invstd w
//                                                 (torch's batch_norm_backward_elemt with dy')
// The statistics (mean, invstd) come from torch.batch_norm_stats and, with several ranks, from
// their combination over ranks (mgg.nn.norm); the two [D] sums are summed over ranks between the
// reduce and the elemt kernels. w and b may be null (affine = False: w = 1, b = 0).
//
// Kernels (one job each)
//   mgg_bn_relu_forward          x -> y
//   mgg_bn_forward               x -> t (no ReLU: batch norm's transform alone, or any per-column
//                                affine map a x + c as mean 0, invstd 1, w = a, b = c)
//   mgg_bn_relu_backward_reduce  (dy, x) -> per-block partial sums, float32 [gridDim.x, 2, D]
//                                (row 0 sum_dy, row 1 sum_dy_xmu); the caller sums the blocks
//                                (a fixed order: the result does not depend on scheduling)
//   mgg_bn_relu_backward_elemt   (dy, x, the two summed [D] vectors) -> dx
// Layout: x, y, dy, dx contiguous row-major float32 [n, D], 16-byte aligned, D = 4 * d4 with d4 a
// power of two <= 256 (D in 4, 8, ..., 1024). One thread handles one float4 (4 columns of a row)
// at a time.
// Launch geometry: blockDim.x = 256, any gridDim.x; a thread strides by gridDim.x * 256 float4s,
// a multiple of d4, so it always sees the same 4 columns and keeps their parameters (and its
// partial sums) in registers. backward_reduce uses 8 * 256 floats of shared memory (static).
#include <stdint.h>

#define MGG_BN_THREADS 256

__device__ __forceinline__ float bn_affine(float x, float m, float is, float w, float b) {
  return w * (x - m) * is + b;
}

struct ColParams {
  float m[4], is[4], w[4], b[4];
};

__device__ __forceinline__ ColParams load_params(const float* __restrict__ mean, const float* __restrict__ invstd,
                                                 const float* __restrict__ weight, const float* __restrict__ bias,
                                                 int c0) {
  ColParams p;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    p.m[k] = mean[c0 + k];
    p.is[k] = invstd[c0 + k];
    p.w[k] = weight ? weight[c0 + k] : 1.0f;
    p.b[k] = bias ? bias[c0 + k] : 0.0f;
  }
  return p;
}

__device__ __forceinline__ void to_array(const float4& v, float* a) {
  a[0] = v.x; a[1] = v.y; a[2] = v.z; a[3] = v.w;
}

template <bool RELU>
__device__ __forceinline__ void bn_forward(const float4* __restrict__ x, float4* __restrict__ y,
                                           const float* __restrict__ mean, const float* __restrict__ invstd,
                                           const float* __restrict__ weight, const float* __restrict__ bias,
                                           long long n4, int d4) {
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  const ColParams p = load_params(mean, invstd, weight, bias, (int)(first % d4) * 4);
  for (long long t = first; t < n4; t += stride) {
    float v[4], o[4];
    to_array(x[t], v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      o[k] = bn_affine(v[k], p.m[k], p.is[k], p.w[k], p.b[k]);
      if (RELU) o[k] = fmaxf(o[k], 0.0f);
    }
    y[t] = make_float4(o[0], o[1], o[2], o[3]);
  }
}

extern "C" __global__ void mgg_bn_relu_forward(const float4* __restrict__ x, float4* __restrict__ y,
                                               const float* __restrict__ mean, const float* __restrict__ invstd,
                                               const float* __restrict__ weight, const float* __restrict__ bias,
                                               long long n4, int d4) {
  bn_forward<true>(x, y, mean, invstd, weight, bias, n4, d4);
}

extern "C" __global__ void mgg_bn_forward(const float4* __restrict__ x, float4* __restrict__ y,
                                          const float* __restrict__ mean, const float* __restrict__ invstd,
                                          const float* __restrict__ weight, const float* __restrict__ bias,
                                          long long n4, int d4) {
  bn_forward<false>(x, y, mean, invstd, weight, bias, n4, d4);
}

extern "C" __global__ void mgg_bn_relu_backward_reduce(const float4* __restrict__ dy, const float4* __restrict__ x,
                                                       const float* __restrict__ mean,
                                                       const float* __restrict__ invstd,
                                                       const float* __restrict__ weight,
                                                       const float* __restrict__ bias,
                                                       float* __restrict__ partial, long long n4, int d4) {
  __shared__ float sums[8][MGG_BN_THREADS];
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  const int c4 = (int)(first % d4);
  const ColParams p = load_params(mean, invstd, weight, bias, c4 * 4);
  float s_dy[4] = {0.f, 0.f, 0.f, 0.f}, s_dyxmu[4] = {0.f, 0.f, 0.f, 0.f};
  for (long long t = first; t < n4; t += stride) {
    float g[4], v[4];
    to_array(dy[t], g);
    to_array(x[t], v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float gk = bn_affine(v[k], p.m[k], p.is[k], p.w[k], p.b[k]) > 0.0f ? g[k] : 0.0f;
      s_dy[k] += gk;
      s_dyxmu[k] += gk * (v[k] - p.m[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    sums[k][threadIdx.x] = s_dy[k];
    sums[4 + k][threadIdx.x] = s_dyxmu[k];
  }
  __syncthreads();
  // thread j sums sum k = j / d4 of column group c = j % d4 over the block's threads of that group
  // (threads c, c + d4, ...: blockDim.x is a multiple of d4, and first % d4 == threadIdx.x % d4)
  const int dim = 4 * d4;
  for (int j = threadIdx.x; j < 8 * d4; j += blockDim.x) {
    const int k = j / d4, c = j % d4;
    float s = 0.0f;
    for (int r = c; r < (int)blockDim.x; r += d4) s += sums[k][r];
    partial[(long long)blockIdx.x * 2 * dim + (k / 4) * dim + c * 4 + (k % 4)] = s;
  }
}

extern "C" __global__ void mgg_bn_relu_backward_elemt(const float4* __restrict__ dy, const float4* __restrict__ x,
                                                      const float* __restrict__ mean,
                                                      const float* __restrict__ invstd,
                                                      const float* __restrict__ weight,
                                                      const float* __restrict__ bias,
                                                      const float* __restrict__ sum_dy,
                                                      const float* __restrict__ sum_dy_xmu,
                                                      float4* __restrict__ dx, long long n4, int d4,
                                                      float inv_count) {
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  const int c0 = (int)(first % d4) * 4;
  const ColParams p = load_params(mean, invstd, weight, bias, c0);
  float grad_mean[4], proj_scale[4], grad_scale[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {  // torch's batch_norm_backward_elemt, per column
    grad_mean[k] = sum_dy[c0 + k] * inv_count;
    proj_scale[k] = sum_dy_xmu[c0 + k] * inv_count * p.is[k] * p.is[k];
    grad_scale[k] = p.is[k] * p.w[k];
  }
  for (long long t = first; t < n4; t += stride) {
    float g[4], v[4], o[4];
    to_array(dy[t], g);
    to_array(x[t], v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float gk = bn_affine(v[k], p.m[k], p.is[k], p.w[k], p.b[k]) > 0.0f ? g[k] : 0.0f;
      o[k] = (gk - grad_mean[k] - (v[k] - p.m[k]) * proj_scale[k]) * grad_scale[k];
    }
    dx[t] = make_float4(o[0], o[1], o[2], o[3]);
  }
}
