// Embedding-bag kernels over an NVSHMEM symmetric table (mgg.embedding, GPU path).
//
// The table is one symmetric array: every PE holds rows_per_pe rows of `ld4` 16-byte vectors
// (D padded to 16 bytes by the store) at the same symmetric address `sym`; a table of the array
// occupies local rows [base, base + slice_rows) of every PE. Two kernels:
//
//   emb_bag_lookup   the whole lookup of one table in one launch: reads the caller's ids and
//                    offsets as they are (int32 or int64), checks them, works out each id's owner
//                    PE and local row (range or hash sharding), reads the row (own rows from
//                    local memory, other PEs' through nvshmem_ptr loads over NVLink, else
//                    nvshmem_float_g) and pools it into out[bag] (sum / mean / max, optional
//                    per-sample weights). `out == nullptr`: checks only (the training path, which
//                    pools in torch). One lane group of L lanes (L = D4 rounded up to a power of
//                    two, at most 32) per bag; the group loads L ids at once, one per lane, and
//                    broadcasts the row addresses.
//   emb_gather_rows  one warp per row: copy row local[i] of PE owner[i] into out[i]; owner < 0
//                    gives a zero row (the training path's padded unique rows).
//
// Bad input never makes a kernel read outside its buffers: an id outside [0, num_rows) reads
// nothing and makes its bag NaN; offsets are clamped to [0, n_ids]. What was wrong is recorded
// in the table's status record (8 int64, see ST_*), which the host reads to raise the error.
// Build (mgg/kernels/build.py):
//   nvcc -arch=sm_90 -rdc=true -std=c++17 -I$NVSHMEM/include -c embedding_bag.cu -o k.o
//   nvcc -arch=sm_90 -dlink -cubin k.o $NVSHMEM/lib/libnvshmem_device.a -o k.cubin
// NVSHMEM's device API: the defines that nvshmem.h and nvshmemx.h include, without their host
// API, collectives and tile API, whose parsing took 2 s of each NVSHMEM source's compile (sm_90,
// nvcc 13.0, NVSHMEM 3.4.5; the linked cubin's code is the same); the two public headers where
// an NVSHMEM lays its headers out otherwise
#if __has_include(<non_abi/nvshmem_build_options.h>) && __has_include(<device/nvshmem_defines.h>) && \
    __has_include(<device/nvshmemx_defines.h>)
#include <non_abi/nvshmem_build_options.h>
#include <device/nvshmem_defines.h>
#include <device/nvshmemx_defines.h>
#else
#include <nvshmem.h>
#include <nvshmemx.h>
#endif
#include <math_constants.h>

#define MGG_EMB_SUM 0
#define MGG_EMB_MEAN 1
#define MGG_EMB_MAX 2
#define MGG_EMB_MAX_PES 64
#define FULL_MASK 0xffffffffu

// The status record of one table (long long [8]); mgg/kernels/embedding_gpu.py names the same slots.
#define ST_FLAGS 0   // bit 0: an id outside [0, N); bit 1: offsets[0] != 0; bit 2: offsets decrease; bit 3: offsets[-1] > n
#define ST_LO 1      // the smallest negative id (0: none)
#define ST_HI 2      // the largest id >= N (0: none)
#define ST_DEC 3     // the first i with offsets[i] < offsets[i - 1] (LLONG_MAX: none)
#define ST_FIRST 4   // offsets[0] when it is not 0
#define ST_LAST 5    // offsets[-1] when it exceeds n
#define ST_ROWS 6    // rows read, cumulative over launches
#define ST_REMOTE 7  // rows read from other PEs, cumulative over launches

__device__ __forceinline__ long long load_index(const void* p, int is64, long long i) {
  return is64 ? reinterpret_cast<const long long*>(p)[i] : (long long)reinterpret_cast<const int*>(p)[i];
}

__device__ __forceinline__ void flag(long long* status, unsigned long long bit) {
  atomicOr(reinterpret_cast<unsigned long long*>(status + ST_FLAGS), bit);
}

__device__ __forceinline__ void record_bad_id(long long* status, long long id) {
  flag(status, 1ull);
  if (id < 0) atomicMin(status + ST_LO, id);
  else atomicMax(status + ST_HI, id);
}

// the fallback read of one 16-byte vector of another PE's row (kept out of line: it is rare, and
// inlined it would cost the common path registers)
__device__ __noinline__ float4 get_vector(const float* src, int pe) {
  float4 v;
  v.x = nvshmem_float_g(src, pe);
  v.y = nvshmem_float_g(src + 1, pe);
  v.z = nvshmem_float_g(src + 2, pe);
  v.w = nvshmem_float_g(src + 3, pe);
  return v;
}

extern "C" __global__ void __launch_bounds__(256) emb_bag_lookup(
    float* __restrict__ out, const float* sym, int ld4, int D,
    const void* __restrict__ ids, int ids64, long long n_ids,
    const void* __restrict__ offsets, int off64, long long n_offsets, long long n_bags, long long bag_size,
    const float* __restrict__ psw,
    long long num_rows, long long slice_rows, long long base, int hash, int world,
    int mode, long long* __restrict__ status) {
  __shared__ const float4* bases[MGG_EMB_MAX_PES];
  __shared__ unsigned long long block_rows, block_remote;
  const int npes = nvshmem_n_pes(), me = nvshmem_my_pe();
  for (int p = threadIdx.x; p < npes && p < MGG_EMB_MAX_PES; p += blockDim.x)
    bases[p] = reinterpret_cast<const float4*>(nvshmem_ptr(sym, p));
  if (threadIdx.x == 0) block_rows = block_remote = 0;
  __syncthreads();

  const int D4 = (D + 3) >> 2;
  const int lane = threadIdx.x & 31;
  int L = 1;
  while (L < D4 && L < 32) L <<= 1;
  const int g = lane / L, c = lane % L;
  const unsigned gmask = (L == 32) ? FULL_MASK : (((1u << L) - 1u) << (g * L));
  const long long wpb = blockDim.x >> 5;
  const long long groups = (long long)gridDim.x * wpb * (32 / L);
  const long long first_group = ((long long)blockIdx.x * wpb + (threadIdx.x >> 5)) * (32 / L) + g;
  const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long threads = (long long)gridDim.x * blockDim.x;

  // offsets[0] and offsets[-1] (once), and the ids after the last bag (include_last_offset with
  // offsets[-1] < n: they belong to no bag but must be valid ids all the same)
  long long tail = n_ids;
  if (offsets != nullptr && n_offsets > 0) {
    const long long last = load_index(offsets, off64, n_offsets - 1);
    if (tid == 0) {
      const long long first = load_index(offsets, off64, 0);
      if (first != 0) { flag(status, 2ull); status[ST_FIRST] = first; }
      if (last > n_ids) { flag(status, 8ull); status[ST_LAST] = last; }
    }
    if (n_bags == n_offsets - 1) tail = last < 0 ? 0 : last;
  }
  for (long long k = tail + tid; k < n_ids; k += threads) {
    const long long id = load_index(ids, ids64, k);
    if (id < 0 || id >= num_rows) record_bad_id(status, id);
  }

  unsigned long long rows = 0, remote = 0;  // this lane's reads (counted once, in column block 0)
  for (long long b = first_group; b < n_bags; b += groups) {
    long long a, e;
    if (offsets == nullptr) {
      a = b * bag_size;
      e = a + bag_size;
    } else {
      a = load_index(offsets, off64, b);
      e = (b + 1 < n_offsets) ? load_index(offsets, off64, b + 1) : n_ids;
      if (c == 0 && b + 1 < n_offsets && e < a) {
        flag(status, 4ull);
        atomicMin(status + ST_DEC, b + 1);
      }
    }
    a = a < 0 ? 0 : (a > n_ids ? n_ids : a);  // clamped: bad offsets read nothing out of bounds
    e = e < a ? a : (e > n_ids ? n_ids : e);
    if (out == nullptr) {  // checks only
      for (long long k = a + c; k < e; k += L) {
        const long long id = load_index(ids, ids64, k);
        if (id < 0 || id >= num_rows) record_bad_id(status, id);
      }
      continue;
    }
    bool bad = false;
    for (int c0 = 0; c0 < D4; c0 += L) {  // column blocks of L vectors
      const int col = c0 + c;
      float4 acc;
      const float init = (mode == MGG_EMB_MAX) ? -CUDART_INF_F : 0.0f;
      acc.x = acc.y = acc.z = acc.w = init;
      for (long long k0 = a; k0 < e; k0 += L) {
        const long long k = k0 + c;  // each lane loads one id of the chunk
        const float4* row = nullptr;
        long long lrow = 0;
        int pe = -1;
        float w = 1.0f;
        if (k < e) {
          const long long id = load_index(ids, ids64, k);
          if (id < 0 || id >= num_rows) {
            if (c0 == 0) record_bad_id(status, id);
          } else {
            if (hash) { pe = (int)(id % world); lrow = base + id / world; }
            else { pe = (int)(id / slice_rows); lrow = base + id - (long long)pe * slice_rows; }
            const float4* pb = pe < MGG_EMB_MAX_PES ? bases[pe] : nullptr;
            row = pb != nullptr ? pb + lrow * ld4 : nullptr;
            if (psw != nullptr) w = psw[k];
            if (c0 == 0) { ++rows; remote += (pe != me); }
          }
        }
        bad |= __any_sync(gmask, k < e && pe < 0);
        const int m = (int)((e - k0) < L ? (e - k0) : L);
#pragma unroll 4  // up to 4 rows' loads in flight per lane group (no spills at 256 threads)
        for (int j = 0; j < m; ++j) {
          const float4* rj = reinterpret_cast<const float4*>(
              __shfl_sync(gmask, reinterpret_cast<unsigned long long>(row), j, L));
          const int pej = __shfl_sync(gmask, pe, j, L);
          const float wj = __shfl_sync(gmask, w, j, L);
          const long long lj = __shfl_sync(gmask, lrow, j, L);
          if (pej < 0 || col >= D4) continue;
          float4 v;
          if (rj != nullptr) {
            v = rj[col];
          } else {  // no load path to that PE: element gets
            v = get_vector(sym + (lj * ld4 + col) * 4, pej);
          }
          if (mode == MGG_EMB_MAX) {
            acc.x = fmaxf(acc.x, v.x); acc.y = fmaxf(acc.y, v.y);
            acc.z = fmaxf(acc.z, v.z); acc.w = fmaxf(acc.w, v.w);
          } else {
            acc.x += wj * v.x; acc.y += wj * v.y; acc.z += wj * v.z; acc.w += wj * v.w;
          }
        }
      }
      if (col >= D4) continue;
      const long long cnt = e - a;
      if (bad) {
        acc.x = acc.y = acc.z = acc.w = CUDART_NAN_F;
      } else if (cnt == 0) {  // an empty bag pools to zeros (torch's rule)
        acc.x = acc.y = acc.z = acc.w = 0.0f;
      } else if (mode == MGG_EMB_MEAN) {
        const float f = (float)cnt;
        acc.x /= f; acc.y /= f; acc.z /= f; acc.w /= f;
      }
      float* dst = out + b * (long long)D + 4 * col;
      if ((D & 3) == 0) {
        *reinterpret_cast<float4*>(dst) = acc;
      } else {
        const float vals[4] = {acc.x, acc.y, acc.z, acc.w};
        for (int j = 0; j < 4 && 4 * col + j < D; ++j) dst[j] = vals[j];
      }
    }
  }

  // rows read (and from other PEs) by this block, added once to the table's counters
  __syncwarp();
  for (int s = 16; s > 0; s >>= 1) {
    rows += __shfl_xor_sync(FULL_MASK, rows, s);
    remote += __shfl_xor_sync(FULL_MASK, remote, s);
  }
  if (lane == 0 && rows) {
    atomicAdd(&block_rows, rows);
    atomicAdd(&block_remote, remote);
  }
  __syncthreads();
  if (threadIdx.x == 0 && block_rows) {
    atomicAdd(reinterpret_cast<unsigned long long*>(status + ST_ROWS), block_rows);
    atomicAdd(reinterpret_cast<unsigned long long*>(status + ST_REMOTE), block_remote);
  }
}

// one warp per row; owner < 0: a zero row
extern "C" __global__ void emb_gather_rows(float* __restrict__ out, const float* sym,
                                           const int* __restrict__ owner, const long long* __restrict__ local,
                                           long long n_rows, int D, int ld) {
  const int lane = threadIdx.x & 31;
  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
  for (long long i = warp; i < n_rows; i += n_warps) {
    const int pe = owner[i];
    float* dst = out + i * (long long)D;
    if (pe < 0) {
      for (int d = lane; d < D; d += 32) dst[d] = 0.0f;
      continue;
    }
    const float* src = sym + local[i] * (long long)ld;
    const float* p = (const float*)nvshmem_ptr(src, pe);
    if (p != nullptr) {
      for (int d = lane; d < D; d += 32) dst[d] = p[d];
    } else {
      nvshmemx_float_get_warp(dst, src, (size_t)D, pe);
    }
  }
}
