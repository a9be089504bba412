// gather_sum_shfl: the bare gather-sum with shuffled indices, a candidate of the benchmarks'
// gather floor (bench/harness/floors.py). CuPy's RawModule compiles it at run time
// (-std=c++17); name expressions pick the template instances.
template <int D4, int U, bool WINDOW>
__global__ void gather_sum_shfl(const float4* __restrict__ table, const int* __restrict__ idx,
                                long long n_idx, float4* __restrict__ out) {
    // The bare gather with the indices loaded as a row kernel loads them: one coalesced index per
    // lane (M of them a step) and each broadcast to its lane group by a shuffle, so an index costs
    // 4 bytes of one warp-wide load instead of a load instruction per lane group. D4 lanes a row
    // (G = 32 / D4 groups), U rows in flight a group: PER = U * G entries a sub-step, a step of
    // 32 * M entries runs SUB sub-steps (a warp-wide index load serves 32 / PER of them when
    // PER < 32, so few rows in flight need not mean wasted index loads or registers).
    // WINDOW = true: warp w takes steps w, w + warps, ... (one moving window of the stream);
    // false: warp w walks slice w of n_idx / warps entries (every warp in its own part).
    constexpr int G = 32 / D4, PER = U * G;
    constexpr int M = PER >= 32 ? PER / 32 : 1, SUB = PER >= 32 ? 1 : 32 / PER, STEP = 32 * M;
    static_assert(PER % 32 == 0 || 32 % PER == 0, "U * G must divide or be a multiple of 32");
    const int lane = threadIdx.x & 31, g = lane / D4, c = lane % D4;
    const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
    long long first, stride, hi;
    if (WINDOW) {
        first = warp * STEP; stride = nwarps * STEP; hi = n_idx;
    } else {
        const long long per = (n_idx + nwarps - 1) / nwarps;
        first = warp * per; stride = STEP; hi = first + per < n_idx ? first + per : n_idx;
    }
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);  // one sum: the U loads are issued before it reads them
    for (long long base = first; base < hi; base += stride) {
        int my[M];
        #pragma unroll
        for (int m = 0; m < M; ++m) {
            const long long k = base + m * 32 + lane;
            my[m] = k < hi ? __ldcs(idx + k) : -1;
        }
        #pragma unroll
        for (int s = 0; s < SUB; ++s) {
            float4 r[U];
            #pragma unroll
            for (int u = 0; u < U; ++u) {  // entry e = s * PER + u * G + g of the step: register e / 32, lane e % 32
                const int e0 = s * PER + u * G;
                const int j = __shfl_sync(0xffffffffu, my[e0 / 32], e0 % 32 + g);
                r[u] = j >= 0 ? __ldg(table + (long long)j * D4 + c) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            #pragma unroll
            for (int u = 0; u < U; ++u) { acc.x += r[u].x; acc.y += r[u].y; acc.z += r[u].z; acc.w += r[u].w; }
        }
    }
    out[blockIdx.x * (long long)blockDim.x + threadIdx.x] = acc;
}
