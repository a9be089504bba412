// The backward of relu(x W^T + b) before its GEMMs (mgg/kernels/relu_grad.py, used by
// mgg.nn.dense.linear_relu): g' = g where y > 0, else 0 (torch's threshold_backward(g, y, 0)), and
// the bias gradient, the column sums of g', in the same pass (torch: a second pass over g').
//
// Kernel
//   mgg_relu_backward_colsum   (g, y) -> g' and per-block partial column sums, float32
//                              [gridDim.x, D]; the caller sums the blocks in a fixed order (the
//                              result does not depend on scheduling)
// Layout: g, y, g' contiguous row-major float32 [n, D], 16-byte aligned, D = 4 * d4 with d4 a
// power of two <= 256 (D in 4, 8, ..., 1024). One thread handles one float4 (4 columns of a row)
// at a time.
// Launch geometry: blockDim.x = 256, any gridDim.x; a thread strides by gridDim.x * 256 float4s, a
// multiple of d4, so it always sees the same 4 columns and keeps their sums in registers
// (block_colsum.cuh: 4 * 256 floats of static shared memory).
#include <stdint.h>

#include "block_colsum.cuh"

#define MGG_RELU_THREADS 256

extern "C" __global__ void mgg_relu_backward_colsum(const float4* __restrict__ g, const float4* __restrict__ y,
                                                    float4* __restrict__ gout, float* __restrict__ partial,
                                                    long long n4, int d4) {
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  float s[4] = {0.f, 0.f, 0.f, 0.f};
  for (long long t = first; t < n4; t += stride) {
    const float4 gv = __ldcs(g + t), yv = __ldcs(y + t);
    const float4 o = make_float4(yv.x > 0.f ? gv.x : 0.f, yv.y > 0.f ? gv.y : 0.f,
                                 yv.z > 0.f ? gv.z : 0.f, yv.w > 0.f ? gv.w : 0.f);
    gout[t] = o;
    s[0] += o.x; s[1] += o.y; s[2] += o.z; s[3] += o.w;
  }
  mgg_block_colsum<MGG_RELU_THREADS>(s, d4, partial);
}
