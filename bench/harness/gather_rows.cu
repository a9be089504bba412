// gather_rows: the bare gather over the CSR's rows, a candidate of the benchmarks'
// gather floor (bench/harness/floors.py). CuPy's RawModule compiles it at run time
// (-std=c++17); name expressions pick the template instances.
template <int D4, bool GROUP, bool PREFETCH>
__global__ void gather_rows(const float4* __restrict__ table, const int* __restrict__ idx,
                            const long long* __restrict__ indptr, long long n_rows, float4* __restrict__ out) {
    // The bare gather over the CSR's rows, as a row kernel walks them: one row per warp (GROUP =
    // false; its G = 32 / D4 lane groups take entries g, g + G, ... of each 32-entry step, every
    // index loaded once by a lane and broadcast by a shuffle, 32 / G rows in flight a group) or
    // one row per lane group (GROUP = true: G rows a warp, D4 entries a step a group, indices
    // shuffled inside the group). Warps take rows in CSR order, one warp (or G rows) each, no
    // loop over tasks: the warps in flight work on neighbouring rows, each walking its list in
    // order -- the locality a row kernel gets from neighbour lists that ascend. PREFETCH: the
    // next step's indices are loaded before this step's rows (as csr_rows does). No weights, no
    // row writes: one conditional store a thread (never taken) keeps the loads alive.
    constexpr int G = 32 / D4;
    const int lane = threadIdx.x & 31, g = lane / D4, c = lane % D4;
    const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (!GROUP) {
        if (warp >= n_rows) return;
        const long long s = indptr[warp], e = indptr[warp + 1];
        int next = PREFETCH && s + lane < e ? __ldcs(idx + s + lane) : -1;
        for (long long base = s; base < e; base += 32) {
            const long long k = base + lane;
            const int my = PREFETCH ? next : (k < e ? __ldcs(idx + k) : -1);
            if (PREFETCH) next = k + 32 < e ? __ldcs(idx + k + 32) : -1;
            float4 r[32 / G];
            #pragma unroll
            for (int u = 0; u < 32 / G; ++u) {
                const int j = __shfl_sync(0xffffffffu, my, u * G + g);
                r[u] = j >= 0 ? __ldg(table + (long long)j * D4 + c) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            #pragma unroll
            for (int u = 0; u < 32 / G; ++u) { acc.x += r[u].x; acc.y += r[u].y; acc.z += r[u].z; acc.w += r[u].w; }
        }
    } else {
        const long long row = warp * G + g;
        if (warp * G >= n_rows) return;
        const long long s = row < n_rows ? indptr[row] : 0, e = row < n_rows ? indptr[row + 1] : 0;
        const int mine = (int)((e - s + D4 - 1) / D4);
        const int steps = (int)__reduce_max_sync(0xffffffffu, (unsigned)mine);
        int next = PREFETCH && s + c < e ? __ldcs(idx + s + c) : -1;
        for (int t = 0; t < steps; ++t) {
            const long long k = s + (long long)t * D4 + c;
            const int my = PREFETCH ? next : (k < e ? __ldcs(idx + k) : -1);
            if (PREFETCH) next = k + D4 < e ? __ldcs(idx + k + D4) : -1;
            float4 r[D4];
            #pragma unroll
            for (int u = 0; u < D4; ++u) {
                const int j = __shfl_sync(0xffffffffu, my, g * D4 + u);
                r[u] = j >= 0 ? __ldg(table + (long long)j * D4 + c) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            #pragma unroll
            for (int u = 0; u < D4; ++u) { acc.x += r[u].x; acc.y += r[u].y; acc.z += r[u].z; acc.w += r[u].w; }
        }
    }
    if (acc.x == -1.2345e30f) out[threadIdx.x] = acc;
}
