// The sum over a sampled block's CSR rows, with the block's dropout and diagonal scales folded in
// (mgg.nn.block_sum on the GPU):
//
//   out[i, c] = dst_scale[i] * sum_{k = ptr[i]}^{ptr[i+1]-1} src_scale[j] * drop(j, c) * x[j, c],   j = col[k]
//
// drop(j, c) = keep(j, c) * scale, keep(j, c) = hash_uniform(j, c, seed) >= p: the dropout of x's
// row j (its position in x, from 0), exactly the mask mgg_dropout draws for rows row0 = 0 ..
// (dropout_hash.cuh), scale = float32(1 / (1 - p)); with drop_on = 0 it is 1. dst_scale and
// src_scale are float32 [n_dst] / [n_src] or null (1): the mean's 1 / deg, GCN's degree factors.
// Nothing exists per edge: the [E, F] messages of index_select + index_add are never written.
// With src_index (int64 [n_src], or null: the identity) x is a table and src j's row is
// x[src_index[j]]: the first layer reads the feature table itself, no gathered copy of its rows
// (mgg.nn.IndexedRows); the dropout still numbers rows by j. With x_addr (or null) the table's
// address is read from device memory at the start (a step replayed from a CUDA graph reads each
// batch's rows where the loader left them: only the 8-byte address changes between replays).
//
// Kernels
//   mgg_block_sum       one warp per dst row, grid-stride over rows. The warp reads 32 of the
//                       row's column ids (and their src_scale) at a time and broadcasts them by
//                       shuffle; lane l accumulates columns 4l .. 4l + 3 of a 128-column chunk
//                       (one float4 load per edge when vec4), rows wider than 128 columns loop
//                       over chunks. Every edge's loads are independent, so the unrolled loop
//                       keeps several rows of x in flight.
//   mgg_block_sum_grad  its transpose, x's gradient from the output's: one warp per dst row i,
//                       lanes as above, grad_x[j, c] += dst_scale[i] * src_scale[j] * drop(j, c)
//                       * g[i, c] for every edge by atomicAdd (the order of the additions, and so
//                       the rounding, varies from run to run, as with torch's CUDA index_add).
//                       grad_x must be zeroed by the caller.
// x, g, out and grad_x are contiguous row-major float32 [rows, dim]; vec4 != 0 only when dim % 4
// == 0 and every one of them is 16-byte aligned. Launch: blockDim.x = 256 (8 warps), gridDim.x =
// min(ceil(n_dst / 8), BLOCKS_PER_SM * SMs); no shared memory.
#include <stdint.h>

#include "dropout_hash.cuh"

typedef long long i64;

#define FULL_MASK 0xffffffffu
#define CHUNK 128  // columns a warp covers at once: 32 lanes x 4

struct BlockDrop {
  unsigned int s1, s2;
  float p, scale;
  int on;
};

__device__ __forceinline__ float4 load_cols(const float* __restrict__ row, int c0, int dim, int vec4) {
  if (vec4) return *reinterpret_cast<const float4*>(row + c0);
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (c0 + 0 < dim) v.x = row[c0 + 0];
  if (c0 + 1 < dim) v.y = row[c0 + 1];
  if (c0 + 2 < dim) v.z = row[c0 + 2];
  if (c0 + 3 < dim) v.w = row[c0 + 3];
  return v;
}

// v * drop(j, c0 .. c0 + 3), as mgg_dropout computes it: (v * keep) * scale
__device__ __forceinline__ float4 dropped(float4 v, i64 j, int c0, const BlockDrop& d) {
  if (!d.on) return v;
  const uint32_t h_row = mgg_lowbias32((uint32_t)((unsigned long long)j & 0xffffffffull) ^ d.s1);
  v.x = (v.x * mgg_keep_factor(h_row, (uint32_t)(c0 + 0), d.s2, d.p)) * d.scale;
  v.y = (v.y * mgg_keep_factor(h_row, (uint32_t)(c0 + 1), d.s2, d.p)) * d.scale;
  v.z = (v.z * mgg_keep_factor(h_row, (uint32_t)(c0 + 2), d.s2, d.p)) * d.scale;
  v.w = (v.w * mgg_keep_factor(h_row, (uint32_t)(c0 + 3), d.s2, d.p)) * d.scale;
  return v;
}

// op(j, r, s) for every edge k of [beg, end), j = col[k], r = src_index[j] (j without an index) and
// s = src_scale[j] (1 without scales): the warp reads 32 of the row's column ids (and their rows
// and scales) at a time and broadcasts them by shuffle, so every lane of the warp must call it with
// the same row
template <typename Op>
__device__ __forceinline__ void for_each_edge(i64 beg, i64 end, int lane, const i64* __restrict__ col,
                                              const i64* __restrict__ src_index,
                                              const float* __restrict__ src_scale, Op op) {
  for (i64 kb = beg; kb < end; kb += 32) {
    const int nk = (int)min((i64)32, end - kb);
    i64 my_j = 0, my_r = 0;
    float my_s = 1.f;
    if (lane < nk) {
      my_j = col[kb + lane];
      my_r = src_index ? src_index[my_j] : my_j;
      if (src_scale) my_s = src_scale[my_j];
    }
#pragma unroll 4
    for (int t = 0; t < nk; ++t)
      op(__shfl_sync(FULL_MASK, my_j, t), __shfl_sync(FULL_MASK, my_r, t), __shfl_sync(FULL_MASK, my_s, t));
  }
}

extern "C" __global__ void mgg_block_sum(const float* __restrict__ x_arg, int dim, const i64* __restrict__ ptr,
                                         const i64* __restrict__ col, i64 n_dst,
                                         const i64* __restrict__ src_index,
                                         const unsigned long long* __restrict__ x_addr,
                                         const float* __restrict__ src_scale, const float* __restrict__ dst_scale,
                                         unsigned int s1, unsigned int s2, float p, float scale, int drop_on,
                                         const unsigned long long* __restrict__ seed_ptr, int vec4,
                                         float* __restrict__ out) {
  mgg_seed_from_device(seed_ptr, s1, s2);
  const float* __restrict__ x = x_addr ? reinterpret_cast<const float*>(*x_addr) : x_arg;
  const BlockDrop d{s1, s2, p, scale, drop_on};
  const int lane = threadIdx.x & 31;
  const i64 n_warps = ((i64)gridDim.x * blockDim.x) >> 5;
  for (i64 i = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; i < n_dst; i += n_warps) {
    const i64 beg = ptr[i], end = ptr[i + 1];
    const float ds = dst_scale ? dst_scale[i] : 1.f;
    for (int cb = 0; cb < dim; cb += CHUNK) {
      const int c0 = cb + 4 * lane;
      const bool active = c0 < dim;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      for_each_edge(beg, end, lane, col, src_index, src_scale, [&](i64 j, i64 r, float s) {
        if (!active) return;
        const float4 v = dropped(load_cols(x + r * dim, c0, dim, vec4), j, c0, d);
        acc.x += s * v.x;
        acc.y += s * v.y;
        acc.z += s * v.z;
        acc.w += s * v.w;
      });
      if (!active) continue;
      float* o = out + i * dim;
      acc.x *= ds; acc.y *= ds; acc.z *= ds; acc.w *= ds;
      if (vec4) {
        *reinterpret_cast<float4*>(o + c0) = acc;
      } else {
        if (c0 + 0 < dim) o[c0 + 0] = acc.x;
        if (c0 + 1 < dim) o[c0 + 1] = acc.y;
        if (c0 + 2 < dim) o[c0 + 2] = acc.z;
        if (c0 + 3 < dim) o[c0 + 3] = acc.w;
      }
    }
  }
}

extern "C" __global__ void mgg_block_sum_grad(const float* __restrict__ g, int dim, const i64* __restrict__ ptr,
                                              const i64* __restrict__ col, i64 n_dst,
                                              const float* __restrict__ src_scale,
                                              const float* __restrict__ dst_scale, unsigned int s1, unsigned int s2,
                                              float p, float scale, int drop_on,
                                              const unsigned long long* __restrict__ seed_ptr, int vec4,
                                              float* __restrict__ grad_x) {
  mgg_seed_from_device(seed_ptr, s1, s2);
  const BlockDrop d{s1, s2, p, scale, drop_on};
  const int lane = threadIdx.x & 31;
  const i64 n_warps = ((i64)gridDim.x * blockDim.x) >> 5;
  for (i64 i = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; i < n_dst; i += n_warps) {
    const i64 beg = ptr[i], end = ptr[i + 1];
    if (beg == end) continue;
    const float ds = dst_scale ? dst_scale[i] : 1.f;
    for (int cb = 0; cb < dim; cb += CHUNK) {
      const int c0 = cb + 4 * lane;
      const bool active = c0 < dim;
      float4 gi = active ? load_cols(g + i * dim, c0, dim, vec4) : make_float4(0.f, 0.f, 0.f, 0.f);
      gi.x *= ds; gi.y *= ds; gi.z *= ds; gi.w *= ds;
      for_each_edge(beg, end, lane, col, nullptr, src_scale, [&](i64 j, i64, float s) {
        if (!active) return;
        const float4 v = dropped(make_float4(s * gi.x, s * gi.y, s * gi.z, s * gi.w), j, c0, d);
        float* r = grad_x + j * dim + c0;
        if (v.x != 0.f) atomicAdd(r + 0, v.x);
        if (c0 + 1 < dim && v.y != 0.f) atomicAdd(r + 1, v.y);
        if (c0 + 2 < dim && v.z != 0.f) atomicAdd(r + 2, v.z);
        if (c0 + 3 < dim && v.w != 0.f) atomicAdd(r + 3, v.w);
      });
    }
  }
}
