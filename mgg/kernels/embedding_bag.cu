// Embedding-bag kernels over an NVSHMEM symmetric table (mgg.embedding, GPU path).
//
// The table is one symmetric array: every PE holds rows_per_pe rows of `ld` floats (the row
// stride: D padded to 16 bytes by the store) at the same symmetric address `sym`, of which the
// first D are the row's values; row `local[i]` of PE `owner[i]` is what the host-side layout (range/hash
// sharding, several tables) computed for id i. Two kernels, one warp per unit of work:
//
//   emb_gather_rows  one warp per unique row: copy the row from its owner into out[i]
//                    (training path: pooling and autograd then run in torch on the rows).
//   emb_bag_fused    one warp per bag: fetch the bag's rows and pool them (sum/mean/max,
//                    optional per-sample weights) straight into out[bag] (inference path).
//
// Remote rows are read with direct loads through nvshmem_ptr when the peer is mapped (NVLink /
// same node), else with a warp-level get (nvshmemx_float_get_warp) staged in shared memory.
// Build (see mgg/kernels/embedding_gpu.py):
//   nvcc -arch=sm_90 -rdc=true -std=c++17 -I$NVSHMEM/include -c embedding_bag.cu -o k.o
//   nvcc -arch=sm_90 -dlink -cubin k.o $NVSHMEM/lib/libnvshmem_device.a -o k.cubin
#include <nvshmem.h>
#include <nvshmemx.h>
#include <math_constants.h>

#define MGG_EMB_SUM 0
#define MGG_EMB_MEAN 1
#define MGG_EMB_MAX 2

extern "C" __global__ void emb_gather_rows(float* __restrict__ out, const float* sym,
                                           const int* __restrict__ owner, const long long* __restrict__ local,
                                           long long n_rows, int D, int ld) {
  const int lane = threadIdx.x & 31;
  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
  for (long long i = warp; i < n_rows; i += n_warps) {
    const int pe = owner[i];
    const float* src = sym + local[i] * (long long)ld;
    float* dst = out + i * (long long)D;
    const float* p = (const float*)nvshmem_ptr(src, pe);
    if (p != nullptr) {
      for (int d = lane; d < D; d += 32) dst[d] = p[d];
    } else {
      nvshmemx_float_get_warp(dst, src, (size_t)D, pe);
    }
  }
}

// one warp per bag; dynamic shared memory: (blockDim.x / 32) * D floats (staging for remote gets)
extern "C" __global__ void emb_bag_fused(float* __restrict__ out, const float* sym,
                                         const int* __restrict__ owner, const long long* __restrict__ local,
                                         const long long* __restrict__ offsets, const float* __restrict__ psw,
                                         long long n_bags, int D, int ld, int mode) {
  extern __shared__ float stage_all[];
  const int lane = threadIdx.x & 31;
  const int wib = threadIdx.x >> 5;
  float* stage = stage_all + (size_t)wib * D;
  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
  for (long long b = warp; b < n_bags; b += n_warps) {
    const long long a = offsets[b], e = offsets[b + 1];
    float* dst = out + b * (long long)D;
    for (int d0 = 0; d0 < D; d0 += 32 * 4) {  // up to 4 values per lane in registers
      float acc[4];
      for (int r = 0; r < 4; ++r) acc[r] = (mode == MGG_EMB_MAX) ? -CUDART_INF_F : 0.0f;
      for (long long k = a; k < e; ++k) {
        const int pe = owner[k];
        const float* src = sym + local[k] * (long long)ld;
        const float* p = (const float*)nvshmem_ptr(src, pe);
        if (p == nullptr) {  // not mapped: stage the whole row with one warp get
          __syncwarp();
          nvshmemx_float_get_warp(stage, src, (size_t)D, pe);
          __syncwarp();
          p = stage;
        }
        const float w = (psw != nullptr) ? psw[k] : 1.0f;
        for (int r = 0; r < 4; ++r) {
          const int d = d0 + r * 32 + lane;
          if (d < D) {
            const float v = p[d];
            if (mode == MGG_EMB_MAX) acc[r] = fmaxf(acc[r], v);
            else acc[r] += w * v;
          }
        }
      }
      const long long cnt = e - a;
      for (int r = 0; r < 4; ++r) {
        const int d = d0 + r * 32 + lane;
        if (d < D) {
          float v = acc[r];
          if (cnt == 0) v = 0.0f;                       // empty bag -> zeros (torch semantics)
          else if (mode == MGG_EMB_MEAN) v /= (float)cnt;
          dst[d] = v;
        }
      }
    }
  }
}
