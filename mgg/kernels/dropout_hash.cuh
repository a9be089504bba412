// The counter-based hash of the dropout kernels (dropout.cu, dropout_project.cu), one copy:
//   mgg_lowbias32     C. Wellons' lowbias32 integer hash (mgg.nn.functional._hash32 on the host)
//   mgg_seed_from_device
//                     a step replayed from a CUDA graph keeps its seed in device memory
//                     (mgg.nn.functional.DeviceSeeds): seed = mix64(*seed_ptr) (splitmix64's
//                     finaliser, mgg.nn.functional.mix_seed) replaces the launch arguments s1, s2
//                     when seed_ptr is not null.
//   mgg_keep_factor   1 or 0: whether the dropout keeps column `col` of the row hashed to h_row,
//                     u >= p with u = (mgg_lowbias32(h_row ^ (col * 0x9E3779B1 + s2)) >> 8) * 2^-24
//                     (mgg.nn.functional.hash_uniform), compared in float32 as torch compares
// Included with #include "dropout_hash.cuh"; mgg.kernels.build hashes it into the cache key of
// every source that includes it.
#pragma once
#include <stdint.h>

__device__ __forceinline__ uint32_t mgg_lowbias32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

__device__ __forceinline__ void mgg_seed_from_device(const unsigned long long* seed_ptr, unsigned int& s1,
                                                     unsigned int& s2) {
  if (seed_ptr == nullptr) return;
  unsigned long long z = *seed_ptr;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  s1 = (unsigned int)(z & 0xffffffffull);
  s2 = (unsigned int)(z >> 32);
}

__device__ __forceinline__ float mgg_keep_factor(uint32_t h_row, uint32_t col, uint32_t s2, float p) {
  const uint32_t h = mgg_lowbias32(h_row ^ (col * 0x9E3779B1u + s2));
  const float u = (float)(h >> 8) * (1.0f / 16777216.0f);
  return u >= p ? 1.0f : 0.0f;
}
