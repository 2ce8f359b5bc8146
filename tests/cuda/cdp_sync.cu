// CUDA 11's dynamic parallelism with device-side cudaDeviceSynchronize: a parent waits for the
// grids it launched and uses what they computed. Deprecated since CUDA 11.6 and gone from
// sm_90 (a module that calls it does not load there) and from CUDA 12, but older programs
// (CUDA's own cdp samples of that time among them) are written this way.
//
// Checks: a block reads what its child wrote once it waited; a recursive merge sort whose
// parents wait for both halves on device-side streams before merging; a recursive sum whose
// partial sums come from malloc'd memory; waits past cudaLimitDevRuntimeSyncDepth fail with
// cudaErrorSyncDepthExceeded; a wait with nothing launched; a wait covers the child's own
// children.
#include <algorithm>
#include <vector>

#include "check.h"

__global__ void fill(int *buf, int base) { buf[base + threadIdx.x] = base + threadIdx.x + 1; }

__global__ void read_after_wait(int *buf, int *out, int *err)
{
    int base = blockIdx.x * 32;
    if (threadIdx.x == 0) {
        fill<<<1, 32>>>(buf, base);
        err[blockIdx.x] = (int)cudaDeviceSynchronize();
    }
    __syncthreads();
    out[base + threadIdx.x] = buf[base + threadIdx.x] * 10;
}

__device__ void insertion_sort(int *v, int lo, int hi)
{
    for (int i = lo + 1; i <= hi; ++i) {
        int x = v[i], j = i - 1;
        while (j >= lo && v[j] > x) {
            v[j + 1] = v[j];
            --j;
        }
        v[j + 1] = x;
    }
}

// Sorts v[lo..hi]: two children sort the halves on streams of their own, the parent waits for
// both and merges them through tmp.
__global__ void merge_sort(int *v, int *tmp, int lo, int hi, int depth, int *err)
{
    if (hi - lo < 32 || depth >= 5) {
        insertion_sort(v, lo, hi);
        return;
    }
    int mid = lo + (hi - lo) / 2;
    cudaStream_t s1, s2;
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    merge_sort<<<1, 1, 0, s1>>>(v, tmp, lo, mid, depth + 1, err);
    merge_sort<<<1, 1, 0, s2>>>(v, tmp, mid + 1, hi, depth + 1, err);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) atomicExch(err, (int)e);
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
    int i = lo, j = mid + 1, k = lo;
    while (i <= mid && j <= hi) tmp[k++] = v[i] <= v[j] ? v[i++] : v[j++];
    while (i <= mid) tmp[k++] = v[i++];
    while (j <= hi) tmp[k++] = v[j++];
    for (k = lo; k <= hi; ++k) v[k] = tmp[k];
}

// The sum of a[0..n): the halves' sums, computed by two children into malloc'd memory.
__global__ void sum(const int *a, int n, int *out, int *err)
{
    if (n <= 64) {
        int s = 0;
        for (int i = 0; i < n; i++) s += a[i];
        *out = s;
        return;
    }
    int *halves = (int *)malloc(2 * sizeof(int));
    if (halves == nullptr) {
        atomicExch(err, -1);
        return;
    }
    sum<<<1, 1>>>(a, n / 2, &halves[0], err);
    sum<<<1, 1>>>(a + n / 2, n - n / 2, &halves[1], err);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) atomicExch(err, (int)e);
    *out = halves[0] + halves[1];
    free(halves);
}

// A chain of grids, each waiting for the next: errs[d] = the wait's result at depth d.
__global__ void chain(int *errs, int depth, int max)
{
    if (depth + 1 < max) chain<<<1, 1>>>(errs, depth + 1, max);
    errs[depth] = (int)cudaDeviceSynchronize();
}

__global__ void idle_wait(int *err) { err[threadIdx.x] = (int)cudaDeviceSynchronize(); }

__global__ void grandchild(int *cell) { cell[1] = cell[0] + 1; }
__global__ void child_launching(int *cell)
{
    cell[0] = 7;
    grandchild<<<1, 1>>>(cell);
}
__global__ void wait_for_descendants(int *cell)
{
    child_launching<<<1, 1>>>(cell);
    cudaDeviceSynchronize();
    cell[2] = cell[1] * 2;
}

int main()
{
    g_program = "cdp_sync";
    cudaDeviceProp prop;
    REQUIRE(cudaGetDeviceProperties(&prop, 0));
    if (prop.major >= 9) {
        // sm_90 and later have no device-side cudaDeviceSynchronize: the module does not load.
        int *err = nullptr;
        REQUIRE(cudaMalloc(&err, sizeof(int)));
        idle_wait<<<1, 1>>>(err);
        cudaError_t e = cudaGetLastError();
        CHECK("on sm_90 and later a kernel calling it does not launch", e != cudaSuccess, "%s",
              cudaGetErrorName(e));
        return finish_summary();
    }
    const int depth_limit = 6;
    CHECK_CUDA("cudaDeviceSetLimit(cudaLimitDevRuntimeSyncDepth, 6)",
               cudaDeviceSetLimit(cudaLimitDevRuntimeSyncDepth, depth_limit));

    const int blocks = 8, n = blocks * 32;
    int *buf = nullptr, *out = nullptr, *err = nullptr;
    REQUIRE(cudaMalloc(&buf, n * sizeof(int)));
    REQUIRE(cudaMalloc(&out, n * sizeof(int)));
    REQUIRE(cudaMalloc(&err, 64 * sizeof(int)));
    REQUIRE(cudaMemset(err, 0xff, 64 * sizeof(int)));
    read_after_wait<<<blocks, 32>>>(buf, out, err);
    CHECK_CUDA("a kernel that waits for its children completes", cudaDeviceSynchronize());
    std::vector<int> h(n), e(64);
    REQUIRE(cudaMemcpy(h.data(), out, n * sizeof(int), cudaMemcpyDeviceToHost));
    REQUIRE(cudaMemcpy(e.data(), err, blocks * sizeof(int), cudaMemcpyDeviceToHost));
    int bad = -1;
    for (int i = 0; i < n && bad < 0; ++i)
        if (h[i] != (i + 1) * 10) bad = i;
    CHECK("each block reads what its child wrote once it waited", bad < 0, "out[%d] = %d", bad,
          bad < 0 ? 0 : h[bad]);
    CHECK("and each wait returned cudaSuccess",
          std::all_of(e.begin(), e.begin() + blocks, [](int x) { return x == 0; }), "%d", e[0]);

    const int m = 4000;
    std::vector<int> data(m);
    unsigned x = 12345;
    for (auto &d : data) {
        x = x * 1103515245u + 12345u;
        d = (int)(x >> 8) % 100000;
    }
    int *dv = nullptr, *tmp = nullptr;
    REQUIRE(cudaMalloc(&dv, m * sizeof(int)));
    REQUIRE(cudaMalloc(&tmp, m * sizeof(int)));
    REQUIRE(cudaMemcpy(dv, data.data(), m * sizeof(int), cudaMemcpyHostToDevice));
    REQUIRE(cudaMemset(err, 0, sizeof(int)));
    merge_sort<<<1, 1>>>(dv, tmp, 0, m - 1, 0, err);
    CHECK_CUDA("a merge sort whose parents wait for their halves completes", cudaDeviceSynchronize());
    std::vector<int> sorted(m);
    REQUIRE(cudaMemcpy(sorted.data(), dv, m * sizeof(int), cudaMemcpyDeviceToHost));
    REQUIRE(cudaMemcpy(e.data(), err, sizeof(int), cudaMemcpyDeviceToHost));
    std::sort(data.begin(), data.end());
    CHECK("it sorts what std::sort sorts", sorted == data && e[0] == 0, "err %d, first difference at %ld",
          e[0], (long)(std::mismatch(sorted.begin(), sorted.end(), data.begin()).first - sorted.begin()));

    const int k = 3000; // waits at depths 0 to 5: within the limit
    std::vector<int> a(k);
    long want = 0;
    for (int i = 0; i < k; ++i) want += a[i] = (i * 7 + 3) % 101;
    int *da = nullptr;
    REQUIRE(cudaMalloc(&da, k * sizeof(int)));
    REQUIRE(cudaMemcpy(da, a.data(), k * sizeof(int), cudaMemcpyHostToDevice));
    REQUIRE(cudaMemset(err, 0, sizeof(int)));
    sum<<<1, 1>>>(da, k, out, err);
    CHECK_CUDA("a recursive sum that waits at every level completes", cudaDeviceSynchronize());
    int s = 0;
    REQUIRE(cudaMemcpy(&s, out, sizeof s, cudaMemcpyDeviceToHost));
    REQUIRE(cudaMemcpy(e.data(), err, sizeof(int), cudaMemcpyDeviceToHost));
    CHECK("its sum of malloc'd partial sums is the host's", s == want && e[0] == 0, "%d, want %ld, err %d", s,
          want, e[0]);

    const int levels = depth_limit + 3;
    REQUIRE(cudaMemset(err, 0xff, 64 * sizeof(int)));
    chain<<<1, 1>>>(err, 0, levels);
    CHECK_CUDA("a chain of waiting grids completes", cudaDeviceSynchronize());
    REQUIRE(cudaMemcpy(e.data(), err, levels * sizeof(int), cudaMemcpyDeviceToHost));
    bool within = true, past = true;
    for (int d = 0; d < levels; ++d) {
        if (d < depth_limit) within = within && e[d] == cudaSuccess;
        else past = past && e[d] == cudaErrorSyncDepthExceeded;
    }
    CHECK("grids shallower than the sync depth limit wait", within, "errs %d %d .. %d", e[0], e[1],
          e[depth_limit - 1]);
    CHECK("deeper ones get cudaErrorSyncDepthExceeded", past, "errs %d .. %d", e[depth_limit],
          e[levels - 1]);

    REQUIRE(cudaMemset(err, 0xff, 64 * sizeof(int)));
    idle_wait<<<1, 64>>>(err);
    CHECK_CUDA("waiting with nothing launched completes", cudaDeviceSynchronize());
    REQUIRE(cudaMemcpy(e.data(), err, 64 * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK("and returns cudaSuccess to every thread",
          std::all_of(e.begin(), e.end(), [](int x) { return x == 0; }), "%d", e[0]);

    int *cell = nullptr;
    REQUIRE(cudaMalloc(&cell, 3 * sizeof(int)));
    REQUIRE(cudaMemset(cell, 0, 3 * sizeof(int)));
    wait_for_descendants<<<1, 1>>>(cell);
    CHECK_CUDA("a wait for a child that launches", cudaDeviceSynchronize());
    int c[3] = {0, 0, 0};
    REQUIRE(cudaMemcpy(c, cell, sizeof c, cudaMemcpyDeviceToHost));
    CHECK("ends after the child's own children", c[0] == 7 && c[1] == 8 && c[2] == 16, "%d %d %d", c[0],
          c[1], c[2]);

    size_t lim = 0;
    REQUIRE(cudaDeviceGetLimit(&lim, cudaLimitDevRuntimeSyncDepth));
    CHECK("cudaDeviceGetLimit reads the sync depth back", lim == (size_t)depth_limit, "%zu", lim);

    for (void *p : {(void *)buf, (void *)out, (void *)err, (void *)dv, (void *)tmp, (void *)da, (void *)cell})
        CUDA_OK(cudaFree(p));
    return finish_summary();
}
