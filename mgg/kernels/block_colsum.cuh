// The per-block column sums of the row-wise kernels that also reduce over rows (relu_grad.cu,
// bias_relu_dropout.cu), one copy:
//   mgg_block_colsum   thread j of a block of THREADS holds s[0..3], its sums of columns
//                      4 c .. 4 c + 3 with c = j % d4 (the grid strides by a multiple of d4, so a
//                      thread always sees the same 4 columns); writes the block's sums of the 4 d4
//                      columns to partial[blockIdx.x * 4 * d4 ..] (the caller sums the blocks' rows
//                      in a fixed order: the result does not depend on scheduling).
// Needs blockDim.x == THREADS, a multiple of d4; 4 * THREADS floats of static shared memory.
// Included with #include "block_colsum.cuh" (mgg.kernels.build hashes it into the cache key).
#pragma once

template <int THREADS>
__device__ __forceinline__ void mgg_block_colsum(const float (&s)[4], int d4, float* __restrict__ partial) {
  __shared__ float sums[4][THREADS];
#pragma unroll
  for (int k = 0; k < 4; ++k) sums[k][threadIdx.x] = s[k];
  __syncthreads();
  // thread j sums column 4 c + k (c = j % d4, k = j / d4) over the block's threads of group c
  // (threads c, c + d4, ...)
  for (int j = threadIdx.x; j < 4 * d4; j += THREADS) {
    const int k = j / d4, c = j % d4;
    float acc = 0.0f;
    for (int r = c; r < THREADS; r += d4) acc += sums[k][r];
    partial[(long long)blockIdx.x * 4 * d4 + c * 4 + k] = acc;
  }
}
