// The counter-based hash of the dropout kernels (dropout.cu, dropout_project.cu), one copy:
//   mgg_lowbias32     C. Wellons' lowbias32 integer hash (mgg.nn.functional._hash32 on the host)
//   mgg_seed_from_device
//                     a step replayed from a CUDA graph keeps its seed in device memory
//                     (mgg.nn.functional.DeviceSeeds): seed = mix64(*seed_ptr) (splitmix64's
//                     finaliser, mgg.nn.functional.mix_seed) replaces the launch arguments s1, s2
//                     when seed_ptr is not null.
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
