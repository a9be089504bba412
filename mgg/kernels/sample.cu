// Sampled mini-batch kernels (mgg.sample on the GPU): neighbor sampling, Fused-Map, host-tier gather.
//
// Plain CUDA C (no NVSHMEM): compiled by CuPy's NVRTC from mgg/kernels/sample_gpu.py. Every
// pointer may be device memory or pinned, device-mapped host memory (UVA): a CSR or a feature
// table too large for the GPU budget is read zero-copy over PCIe / C2C.
//
// 1. sample_uniform: one thread per seed; uniform sampling of k = min(deg, fanout) distinct edge
//    positions of the seed's CSR row *without replacement* by Floyd's algorithm (k draws, each
//    checked against the <= k positions already taken: O(k^2) with k = fanout, ~25). Randoms are
//    counter-based (splitmix64 of seed, seed index and draw), so a batch is reproducible.
//    For k <= FLOYD_SHARED_K the taken positions live in shared memory (32-bit, one column per
//    thread: conflict-free), so the k^2 / 2 checks never touch global memory; larger k keep them
//    in the output row. Both give the same sample (mgg.testing.sample_reference is the spec).
//    A seed with k = 0 reads nothing (so seeds past a device-side count, whose out_ptr entries
//    are flat, may hold anything); out_base (null: 0) is a device-side offset added to out_nbr.
//    Launch: 1-D, SAMPLE_THREADS (256) threads per block, ceil(B / 256) blocks.
// 2. fused_map_insert / fused_map_lookup (FastGL's Fused-Map): an open-addressing GPU hash table
//    (linear probing, capacity a power of two >= 2 n) keyed by the global id; insert does
//    atomicCAS on the key and atomicMin of the element's position into the value (keys and
//    values both start at all ones: EMPTY_KEY and the largest unsigned position, so one fill
//    sets the table), so each slot ends with the *first* position the id occurs at; lookup finds
//    each element's slot and flags first occurrences. A prefix sum over the flags (torch.cumsum)
//    then numbers the unique ids in first-occurrence order (seeds, which come first and are
//    unique, keep ids 0..B-1) and fused_map_compact gives every element its local id: no sort,
//    no unique, one pass over the ids.
//    The element count is n = n_fixed + *n_var (n_var may be null: n = n_fixed), and n_fixed is
//    *n_fixed_dev when that is given, both read on the device, so a hop's kernels can run on
//    buffers sized by an upper bound before the host knows how many nodes the previous hop
//    found or how many neighbors this one sampled. Launch: 1-D, 256 threads per block, grid over the bound.
// 3. fused_map_compact: from the inclusive prefix sum `rank` of the first-occurrence flags, writes
//    the unique ids (n_id[rank[i] - 1] = ids[i] where i is a first occurrence), the local id of
//    every element past the first n_fixed (local[i - n_fixed] = rank[first_pos[i]] - 1), and, when
//    next_count is given, the next hop's sample count of every unique id, min(deg, next_fanout),
//    at its local id (the next hop's edge count is then a sum on the device, read with this
//    hop's sizes in one copy). Replaces a boolean-mask compaction (a host synchronisation).
// 4. gather_rows_aligned (PyTorch-Direct's zero-copy access): one warp per output row; the warp
//    walks the source row in 128-byte segments *aligned to 128 bytes* (starting at the aligned
//    address at or below the row start, lanes outside the row idle), so every warp request is one
//    whole, aligned PCIe/C2C transaction even when the row stride is not a multiple of 128 bytes.
//    Each lane keeps GATHER_UNROLL loads in flight (zero-copy reads have microseconds of latency).
//    Launch: 1-D, 256 threads (8 warps) per block, grid-stride over rows; the grid is capped at a
//    few blocks per SM (the launcher's blocks_per_sm) so that a prefetching gather leaves most of
//    every SM to the compute kernels running beside it.

typedef long long i64;
typedef unsigned long long u64;

#define EMPTY_KEY 0xFFFFFFFFFFFFFFFFull
#define GATHER_UNROLL 4
#define SAMPLE_THREADS 256
#define FLOYD_SHARED_K 32

__device__ __forceinline__ u64 splitmix64(u64 x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// uniform integer in [0, n) from a 64-bit hash (Lemire's multiply-shift; n < 2^32)
__device__ __forceinline__ i64 bounded(u64 h, i64 n) {
  return (i64)(((h >> 32) * (u64)n) >> 32);
}

extern "C" __global__ void sample_uniform(const i64* __restrict__ indptr, const i64* __restrict__ indices,
                                          const i64* __restrict__ seeds, const i64* __restrict__ out_ptr,
                                          i64 n_seeds, int fanout, u64 rng_seed, i64* __restrict__ out_nbr,
                                          const i64* __restrict__ out_base) {
  __shared__ unsigned int taken_all[FLOYD_SHARED_K * SAMPLE_THREADS];
  unsigned int* taken = taken_all + threadIdx.x;  // this thread's column: taken[q * SAMPLE_THREADS]
  if (out_base) out_nbr += *out_base;
  for (i64 s = (i64)blockIdx.x * blockDim.x + threadIdx.x; s < n_seeds; s += (i64)gridDim.x * blockDim.x) {
    const i64 k = out_ptr[s + 1] - out_ptr[s];  // min(deg, fanout), computed by the launcher
    if (k == 0) continue;                       // also every seed past a device-side count
    const i64 node = seeds[s];
    const i64 beg = indptr[node], deg = indptr[node + 1] - beg;
    i64* out = out_nbr + out_ptr[s];
    if (k == deg) {                                // all neighbors
      for (i64 q = 0; q < deg; ++q) out[q] = indices[beg + q];
      continue;
    }
    // Floyd: for j = deg-k .. deg-1: t = uniform[0, j]; take t unless taken, else take j.
    // The taken *positions* are kept in out[] (as positions) and mapped to ids at the end.
    const u64 base = splitmix64(rng_seed ^ splitmix64((u64)s));
    if (k <= FLOYD_SHARED_K && deg <= 0xFFFFFFFFll) {
      for (i64 q = 0; q < k; ++q) {
        const i64 j = deg - k + q;
        unsigned int t = (unsigned int)bounded(splitmix64(base + (u64)q), j + 1);
        for (i64 r = 0; r < q; ++r) {
          if (taken[r * SAMPLE_THREADS] == t) { t = (unsigned int)j; break; }
        }
        taken[q * SAMPLE_THREADS] = t;
      }
      for (i64 q = 0; q < k; ++q) out[q] = indices[beg + taken[q * SAMPLE_THREADS]];
      continue;
    }
    for (i64 q = 0; q < k; ++q) {
      const i64 j = deg - k + q;
      i64 t = bounded(splitmix64(base + (u64)q), j + 1);
      for (i64 r = 0; r < q; ++r) {
        if (out[r] == t) { t = j; break; }
      }
      out[q] = t;
    }
    for (i64 q = 0; q < k; ++q) out[q] = indices[beg + out[q]];
  }
}

// the fixed part of a Fused-Map pass's elements: *n_fixed_dev when given (read on the device), else n_fixed
__device__ __forceinline__ i64 fixed_count(i64 n_fixed, const i64* n_fixed_dev) {
  return n_fixed_dev ? *n_fixed_dev : n_fixed;
}

// the element count of a Fused-Map pass: the fixed part plus the device-side count *n_var (if given)
__device__ __forceinline__ i64 element_count(i64 n_fixed, const i64* n_fixed_dev, const i64* n_var) {
  const i64 f = fixed_count(n_fixed, n_fixed_dev);
  return n_var ? f + *n_var : f;
}

extern "C" __global__ void fused_map_insert(const i64* __restrict__ ids, i64 n_fixed,
                                            const i64* __restrict__ n_fixed_dev, const i64* __restrict__ n_var,
                                            u64* __restrict__ keys, u64* __restrict__ vals, i64 mask) {
  const i64 n = element_count(n_fixed, n_fixed_dev, n_var);
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    const u64 key = (u64)ids[i];
    i64 slot = (i64)(splitmix64(key) & (u64)mask);
    while (true) {
      const u64 prev = atomicCAS(keys + slot, EMPTY_KEY, key);
      if (prev == EMPTY_KEY || prev == key) {
        atomicMin(vals + slot, (u64)i);
        break;
      }
      slot = (slot + 1) & mask;
    }
  }
}

extern "C" __global__ void fused_map_lookup(const i64* __restrict__ ids, i64 n_fixed,
                                            const i64* __restrict__ n_fixed_dev, const i64* __restrict__ n_var,
                                            const u64* __restrict__ keys, const u64* __restrict__ vals, i64 mask,
                                            i64* __restrict__ first_pos, unsigned char* __restrict__ is_first) {
  const i64 n = element_count(n_fixed, n_fixed_dev, n_var);
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    const u64 key = (u64)ids[i];
    i64 slot = (i64)(splitmix64(key) & (u64)mask);
    while (keys[slot] != key) slot = (slot + 1) & mask;  // inserted: always found
    const i64 p = (i64)vals[slot];
    first_pos[i] = p;
    is_first[i] = (p == i);
  }
}

extern "C" __global__ void fused_map_compact(const i64* __restrict__ ids, i64 n_fixed,
                                             const i64* __restrict__ n_fixed_dev, const i64* __restrict__ n_var,
                                             const i64* __restrict__ first_pos,
                                             const unsigned char* __restrict__ is_first,
                                             const i64* __restrict__ rank, const i64* __restrict__ indptr,
                                             i64 next_fanout, i64* __restrict__ n_id, i64* __restrict__ local,
                                             i64* __restrict__ next_count) {
  n_fixed = fixed_count(n_fixed, n_fixed_dev);
  const i64 n = element_count(n_fixed, nullptr, n_var);
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    if (is_first[i]) {
      const i64 j = rank[i] - 1, node = ids[i];
      n_id[j] = node;
      if (next_count) {
        const i64 deg = indptr[node + 1] - indptr[node];
        next_count[j] = deg < next_fanout ? deg : next_fanout;
      }
    }
    if (i >= n_fixed) local[i - n_fixed] = rank[first_pos[i]] - 1;
  }
}

extern "C" __global__ void gather_rows_aligned(const float* __restrict__ src, i64 row_stride, int width,
                                               const i64* __restrict__ rows, i64 n_rows,
                                               float* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const i64 n_warps = ((i64)gridDim.x * blockDim.x) >> 5;
  for (i64 r = warp; r < n_rows; r += n_warps) {
    const float* row = src + rows[r] * row_stride;
    // first 128-byte boundary at or below the row start, in floats relative to the row
    const i64 shift = (i64)(((unsigned long long)row & 127ull) >> 2);
    float* o = out + r * (i64)width;
    // UNROLL segments per round: their loads are all in flight before the first store
    for (i64 w0 = -shift + lane; w0 < width; w0 += 32 * GATHER_UNROLL) {
      float v[GATHER_UNROLL];
#pragma unroll
      for (int k = 0; k < GATHER_UNROLL; ++k) {
        const i64 w = w0 + 32 * k;
        v[k] = (w >= 0 && w < width) ? row[w] : 0.f;
      }
#pragma unroll
      for (int k = 0; k < GATHER_UNROLL; ++k) {
        const i64 w = w0 + 32 * k;
        if (w >= 0 && w < width) o[w] = v[k];
      }
    }
  }
}
