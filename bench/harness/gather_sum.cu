// gather_sum: the flat bare gather-sum, a candidate of the benchmarks'
// gather floor (bench/harness/floors.py). CuPy's RawModule compiles it at run time
// (-std=c++17); name expressions pick the template instances.
template <int U, bool WINDOW>
__global__ void gather_sum(const float4* __restrict__ table, const int* __restrict__ idx,
                           long long n_idx, int d4, float4* __restrict__ out) {
    // lanes in groups of d4 (d4 <= 32, a power of two), 16 B per lane, U rows in flight per group
    // (independent loads and sums: the memory system, not one load's latency, sets the rate).
    // WINDOW = false: warp w reads slice w of n_idx / warps entries (every warp in a different
    // part of the stream at once); WINDOW = true: warp w reads chunks w, w + warps, ... of
    // U * groups entries (the warps at work read one window of the stream, as a kernel that
    // hands consecutive work to consecutive warps does).
    const int lane = threadIdx.x & 31, groups = 32 / d4, g = lane / d4, c = lane % d4;
    const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
    float4 acc[U];
    #pragma unroll
    for (int u = 0; u < U; ++u) acc[u] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (WINDOW) {
        const long long step = (long long)U * groups;
        for (long long base = warp * step; base < n_idx; base += nwarps * step) {
            int r[U];
            #pragma unroll
            for (int u = 0; u < U; ++u) {
                const long long k = base + u * groups + g;
                r[u] = k < n_idx ? __ldcs(idx + k) : -1;
            }
            #pragma unroll
            for (int u = 0; u < U; ++u) if (r[u] >= 0) {
                const float4 v = __ldg(table + (long long)r[u] * d4 + c);
                acc[u].x += v.x; acc[u].y += v.y; acc[u].z += v.z; acc[u].w += v.w;
            }
        }
    } else {
        const long long per = (n_idx + nwarps - 1) / nwarps, lo = warp * per;
        const long long hi = lo + per < n_idx ? lo + per : n_idx;
        long long k = lo + g;
        for (; k + (U - 1) * groups < hi; k += U * groups) {
            int r[U];
            #pragma unroll
            for (int u = 0; u < U; ++u) r[u] = __ldcs(idx + k + u * groups);
            #pragma unroll
            for (int u = 0; u < U; ++u) {
                const float4 v = __ldg(table + (long long)r[u] * d4 + c);
                acc[u].x += v.x; acc[u].y += v.y; acc[u].z += v.z; acc[u].w += v.w;
            }
        }
        for (; k < hi; k += groups) {
            const float4 v = __ldg(table + (long long)idx[k] * d4 + c);
            acc[0].x += v.x; acc[0].y += v.y; acc[0].z += v.z; acc[0].w += v.w;
        }
    }
    #pragma unroll
    for (int u = 1; u < U; ++u) { acc[0].x += acc[u].x; acc[0].y += acc[u].y; acc[0].z += acc[u].z; acc[0].w += acc[u].w; }
    out[blockIdx.x * (long long)blockDim.x + threadIdx.x] = acc[0];
}
