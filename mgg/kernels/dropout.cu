// Fused, partition-independent dropout: out = x * keep / (1 - p) in one pass, no mask in memory.
//
// The keep decision of element (global row g, column c) is the counter-based uniform of
// mgg.nn.functional.hash_uniform, bit for bit:
//     s1 = seed & 0xffffffff, s2 = seed >> 32
//     h_row = mgg_lowbias32((g & 0xffffffff) ^ s1)
//     u = (mgg_lowbias32(h_row ^ (c * 0x9E3779B1 + s2)) >> 8) * 2^-24        (uint32 arithmetic)
//     keep = u >= p                                                        (float32 compare)
// so the same seed gives the same mask on any device and in any partition, and the backward
// regenerates the mask from the seed (grad_x = grad_out * keep * scale: the same kernel).
// out = (x * (keep ? 1 : 0)) * scale, scale = float32(1 / float32(1 - p)), as torch's CUDA
// `x * keep / (1 - p)` computes it (a CPU scalar divisor becomes a multiply by its reciprocal).
// With `row_scale` (float32 [n_rows], or null) each output row r is then multiplied by
// row_scale[r]: a per-row factor folded into the same pass (the gcn column factor of the
// aggregation that reads `out`, mgg.nn.functional.global_dropout(row_scale=)); the backward is
// the same call with the same row_scale.
//
// Kernel
//   mgg_dropout   one thread per (row, group of 4 consecutive columns); grid-stride loop over the
//                 n_rows * ceil(D / 4) groups. A thread hashes its row once and its <= 4 columns;
//                 with vec4 != 0 (D % 4 == 0, x and out 16-byte aligned) it loads and stores one
//                 float4, else up to 4 scalars.
// Launch geometry: blockDim.x = 256 (any multiple of 32 works), gridDim.x = min(ceil(groups /
// 256), 32 * SMs); no shared memory. x and out are contiguous row-major [n_rows, D] float32.
#include <stdint.h>

#include "dropout_hash.cuh"

extern "C" __global__ void mgg_dropout(const float* __restrict__ x, float* __restrict__ out,
                                       long long n_rows, int dim, long long row0,
                                       unsigned int s1, unsigned int s2, float p, float scale,
                                       int vec4, const unsigned long long* __restrict__ seed_ptr,
                                       const float* __restrict__ row_scale) {
  mgg_seed_from_device(seed_ptr, s1, s2);
  const long long groups_per_row = (dim + 3) / 4;
  const long long total = n_rows * groups_per_row;
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
       t += (long long)gridDim.x * blockDim.x) {
    // 32-bit division when the index fits (far cheaper than a 64-bit one on the GPU)
    const long long r = total <= 0xffffffffll ? (long long)((uint32_t)t / (uint32_t)groups_per_row)
                                              : t / groups_per_row;
    const int c0 = (int)(t - r * groups_per_row) * 4;
    const uint32_t h_row = mgg_lowbias32((uint32_t)((unsigned long long)(row0 + r) & 0xffffffffull) ^ s1);
    const long long base = r * dim + c0;
    const float rs = row_scale ? __ldg(row_scale + r) : 1.0f;
    if (vec4) {
      const float4 v = reinterpret_cast<const float4*>(x + base)[0];
      float4 o;
      o.x = (v.x * mgg_keep_factor(h_row, c0 + 0, s2, p)) * scale;
      o.y = (v.y * mgg_keep_factor(h_row, c0 + 1, s2, p)) * scale;
      o.z = (v.z * mgg_keep_factor(h_row, c0 + 2, s2, p)) * scale;
      o.w = (v.w * mgg_keep_factor(h_row, c0 + 3, s2, p)) * scale;
      if (row_scale) { o.x *= rs; o.y *= rs; o.z *= rs; o.w *= rs; }
      reinterpret_cast<float4*>(out + base)[0] = o;
    } else {
      const int n = min(4, dim - c0);
      for (int k = 0; k < n; ++k) {
        const float o = (x[base + k] * mgg_keep_factor(h_row, (uint32_t)(c0 + k), s2, p)) * scale;
        out[base + k] = row_scale ? o * rs : o;
      }
    }
  }
}
