// Dynamic parallelism (built with -rdc=true and libcudadevrt): kernels launching kernels. A
// child grid per block, children that see what their parent wrote before launching them and
// run in launch order, a recursive quicksort that launches its halves (on the NULL stream, and
// on device-side streams as CUDA's cdpSimpleQuicksort does), an event ordering children of two
// device-side streams, launches nested to
// CUDA's depth limit and failing past it, the pending launch limit (CUDA's 2048, and raised
// with cudaDeviceSetLimit), a launch with a bad configuration failing in the kernel, and a
// parent whose host-side synchronization waits for all its descendants.
#include "check.h"

#include <algorithm>
#include <vector>

__global__ void child(int *out, int base)
{
    int i = base + threadIdx.x;
    out[i] = 3 * i + 1;
}

__global__ void parent(int *out)
{
    if (threadIdx.x == 0) child<<<1, blockDim.x>>>(out, blockIdx.x * blockDim.x);
}

__global__ void add_one(int *cell) { cell[0] += 1; }
__global__ void times_ten(int *cell) { cell[0] *= 10; }

// cell = ((5 + 1) * 10): the children see the parent's write and run in launch order.
__global__ void ordered(int *cell)
{
    cell[0] = 5;
    add_one<<<1, 1>>>(cell);
    times_ten<<<1, 1>>>(cell);
}

// Sorts v[lo..=hi] by insertion (small ranges).
__device__ void insertion_sort(int *v, int lo, int hi)
{
    for (int i = lo + 1; i <= hi; i++) {
        int x = v[i], j = i - 1;
        while (j >= lo && v[j] > x) {
            v[j + 1] = v[j];
            j--;
        }
        v[j + 1] = x;
    }
}

// Partitions v[lo..=hi] around v[lo]; returns where the pivot ends.
__device__ int partition(int *v, int lo, int hi)
{
    int pivot = v[lo], i = lo + 1, j = hi;
    while (i <= j) {
        while (i <= j && v[i] <= pivot) i++;
        while (i <= j && v[j] > pivot) j--;
        if (i < j) {
            int t = v[i];
            v[i] = v[j];
            v[j] = t;
        }
    }
    v[lo] = v[j];
    v[j] = pivot;
    return j;
}

// Quicksort: each launch partitions its range around its first element and launches a grid
// for each side (small ranges are sorted by insertion in place).
__global__ void quicksort(int *v, int lo, int hi, int depth)
{
    if (hi - lo < 16 || depth >= 20) {
        insertion_sort(v, lo, hi);
        return;
    }
    int j = partition(v, lo, hi);
    quicksort<<<1, 1>>>(v, lo, j - 1, depth + 1);
    quicksort<<<1, 1>>>(v, j + 1, hi, depth + 1);
}

// CUDA's cdpSimpleQuicksort way: each half on a non-blocking stream of its own, created and
// destroyed in the kernel.
__global__ void quicksort_streams(int *v, int lo, int hi, int depth)
{
    if (hi - lo < 16 || depth >= 20) {
        insertion_sort(v, lo, hi);
        return;
    }
    int j = partition(v, lo, hi);
    cudaStream_t s1, s2;
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    quicksort_streams<<<1, 1, 0, s1>>>(v, lo, j - 1, depth + 1);
    quicksort_streams<<<1, 1, 0, s2>>>(v, j + 1, hi, depth + 1);
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
}

// An event recorded after a child on one stream, waited for by another stream's child:
// cell = (5 + 1) * 10.
__global__ void event_order(int *cell, int *err)
{
    cell[0] = 5;
    cudaStream_t a, b;
    cudaEvent_t e;
    err[0] = (int)cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    err[1] = (int)cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    err[2] = (int)cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    add_one<<<1, 1, 0, a>>>(cell);
    err[3] = (int)cudaEventRecord(e, a);
    err[4] = (int)cudaStreamWaitEvent(b, e, 0);
    times_ten<<<1, 1, 0, b>>>(cell);
    err[5] = (int)cudaEventDestroy(e);
    err[6] = (int)(cudaStreamDestroy(a) | cudaStreamDestroy(b));
    err[7] = a != b && a != 0;
}

// The device as kernels see it: its number, the device count, and three attributes.
__global__ void device_queries(int *out)
{
    out[0] = (int)cudaGetDevice(&out[1]);
    out[2] = (int)cudaGetDeviceCount(&out[3]);
    out[4] = (int)cudaDeviceGetAttribute(&out[5], cudaDevAttrMultiProcessorCount, 0);
    out[6] = (int)cudaDeviceGetAttribute(&out[7], cudaDevAttrComputeCapabilityMajor, 0);
    out[8] = (int)cudaDeviceGetAttribute(&out[9], cudaDevAttrMaxThreadsPerBlock, 0);
    out[10] = (int)cudaDeviceGetAttribute(&out[11], cudaDevAttrMaxThreadsPerBlock, 7);
}

// What kernels ask the device runtime about a kernel and the context: fa[] a kernel's
// attributes, occupancy of 128-thread blocks, and the limits; the calls' errors in err[].
__global__ void runtime_queries(int *fa, size_t *lim, int *err)
{
    cudaFuncAttributes a;
    err[0] = (int)cudaFuncGetAttributes(&a, child);
    fa[0] = a.maxThreadsPerBlock;
    fa[1] = a.numRegs;
    fa[2] = (int)a.sharedSizeBytes;
    fa[3] = a.ptxVersion;
    fa[4] = a.binaryVersion;
    fa[5] = (int)a.localSizeBytes;
    err[1] = (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fa[6], child, 128, 0);
    err[2] = (int)cudaDeviceGetLimit(&lim[0], cudaLimitMallocHeapSize);
    err[3] = (int)cudaDeviceGetLimit(&lim[1], cudaLimitDevRuntimePendingLaunchCount);
    err[4] = (int)cudaDeviceGetLimit(&lim[2], cudaLimitDevRuntimeSyncDepth);
    err[5] = (int)cudaDeviceGetLimit(&lim[3], cudaLimitPrintfFifoSize);
    cudaFuncCache cache;
    cudaSharedMemConfig banks;
    err[6] = (int)cudaDeviceGetCacheConfig(&cache);
    err[7] = (int)cudaDeviceGetSharedMemConfig(&banks);
    fa[7] = (int)cache;
    fa[8] = (int)banks;
    err[8] = (int)cudaFuncGetAttributes(&a, (const void *)fa);
}

// A chain of launches: levels[d] = d + 1 and errs[d] = the launch's error at each depth.
__global__ void nested(int *levels, int *errs, int depth, int max)
{
    levels[depth] = depth + 1;
    if (depth + 1 < max) {
        nested<<<1, 1>>>(levels, errs, depth + 1, max);
        errs[depth] = (int)cudaGetLastError();
    }
}

// Every thread launches a one-thread child: out[i] = 3 * i + 1.
__global__ void fan_out(int *out)
{
    child<<<1, 1>>>(out, blockIdx.x * blockDim.x + threadIdx.x);
}

__global__ void bad_config(int *out, int *err)
{
    child<<<1, 4096>>>(out, 0);
    err[0] = (int)cudaGetLastError();
}

int main()
{
    g_program = "dynamic_parallelism";
    const int blocks = 8, threads = 64, n = blocks * threads;
    int *out = nullptr;
    REQUIRE(cudaMalloc(&out, n * sizeof(int)));
    REQUIRE(cudaMemset(out, 0xff, n * sizeof(int)));
    parent<<<blocks, threads>>>(out);
    CHECK_CUDA("a kernel that launches kernels launches", cudaGetLastError());
    CHECK_CUDA("and its children complete with it", cudaDeviceSynchronize());
    std::vector<int> h(n);
    REQUIRE(cudaMemcpy(h.data(), out, n * sizeof(int), cudaMemcpyDeviceToHost));
    int bad = -1;
    for (int i = 0; i < n && bad < 0; i++)
        if (h[i] != 3 * i + 1) bad = i;
    CHECK("each block's child grid wrote its part", bad < 0, "out[%d] = %d", bad, bad < 0 ? 0 : h[bad]);

    int *cell = nullptr;
    REQUIRE(cudaMalloc(&cell, sizeof(int)));
    ordered<<<1, 1>>>(cell);
    REQUIRE(cudaDeviceSynchronize());
    int c = 0;
    REQUIRE(cudaMemcpy(&c, cell, sizeof c, cudaMemcpyDeviceToHost));
    CHECK("children see their parent's writes and run in launch order", c == 60, "%d", c);

    const int len = 3000;
    std::vector<int> data(len);
    unsigned s = 12345;
    for (int &x : data) x = int((s = s * 1103515245u + 12345u) >> 8) % 100000;
    int *dv = nullptr;
    REQUIRE(cudaMalloc(&dv, len * sizeof(int)));
    REQUIRE(cudaMemcpy(dv, data.data(), len * sizeof(int), cudaMemcpyHostToDevice));
    quicksort<<<1, 1>>>(dv, 0, len - 1, 0);
    CHECK_CUDA("a recursive quicksort", cudaDeviceSynchronize());
    std::vector<int> sorted(len);
    REQUIRE(cudaMemcpy(sorted.data(), dv, len * sizeof(int), cudaMemcpyDeviceToHost));
    std::sort(data.begin(), data.end());
    CHECK("sorts what std::sort sorts", sorted == data, "first difference at %ld",
          long(std::mismatch(sorted.begin(), sorted.end(), data.begin()).first - sorted.begin()));

    for (int &x : data) x = int((s = s * 1103515245u + 12345u) >> 8) % 100000;
    REQUIRE(cudaMemcpy(dv, data.data(), len * sizeof(int), cudaMemcpyHostToDevice));
    quicksort_streams<<<1, 1>>>(dv, 0, len - 1, 0);
    CHECK_CUDA("a quicksort whose halves run on device-side streams", cudaDeviceSynchronize());
    REQUIRE(cudaMemcpy(sorted.data(), dv, len * sizeof(int), cudaMemcpyDeviceToHost));
    std::sort(data.begin(), data.end());
    CHECK("sorts what std::sort sorts, too", sorted == data, "first difference at %ld",
          long(std::mismatch(sorted.begin(), sorted.end(), data.begin()).first - sorted.begin()));

    int *ev_err = nullptr;
    REQUIRE(cudaMalloc(&ev_err, 8 * sizeof(int)));
    REQUIRE(cudaMemset(ev_err, 0xff, 8 * sizeof(int)));
    event_order<<<1, 1>>>(cell, ev_err);
    CHECK_CUDA("device-side streams and events", cudaDeviceSynchronize());
    int ee[8];
    REQUIRE(cudaMemcpy(ee, ev_err, sizeof ee, cudaMemcpyDeviceToHost));
    REQUIRE(cudaMemcpy(&c, cell, sizeof c, cudaMemcpyDeviceToHost));
    CHECK("an event orders a child on another stream after the one it follows",
          c == 60 && ee[0] == 0 && ee[1] == 0 && ee[2] == 0 && ee[3] == 0 && ee[4] == 0 && ee[5] == 0 && ee[6] == 0 &&
              ee[7] == 1,
          "cell %d, errors %d %d %d %d %d %d %d, distinct %d", c, ee[0], ee[1], ee[2], ee[3], ee[4], ee[5], ee[6], ee[7]);
    CUDA_OK(cudaFree(ev_err));

    {
        int *q = nullptr;
        REQUIRE(cudaMalloc(&q, 12 * sizeof(int)));
        REQUIRE(cudaMemset(q, 0xff, 12 * sizeof(int)));
        device_queries<<<1, 1>>>(q);
        CHECK_CUDA("device queries in a kernel", cudaDeviceSynchronize());
        int h[12];
        REQUIRE(cudaMemcpy(h, q, sizeof h, cudaMemcpyDeviceToHost));
        int sms = 0, major = 0, threads = 0;
        REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
        REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
        REQUIRE(cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerBlock, 0));
        CHECK("a kernel sees its device, the device count and the attributes the host sees",
              h[0] == 0 && h[1] == 0 && h[2] == 0 && h[3] == 1 && h[4] == 0 && h[5] == sms && h[6] == 0 &&
                  h[7] == major && h[8] == 0 && h[9] == threads,
              "device %d/%d, count %d/%d, SMs %d/%d (host %d), major %d/%d (host %d), threads %d/%d (host %d)", h[0],
              h[1], h[2], h[3], h[4], h[5], sms, h[6], h[7], major, h[8], h[9], threads);
        CHECK("an attribute of a device that does not exist is refused", h[10] != 0, "%d", h[10]);
        CUDA_OK(cudaFree(q));
    }

    {
        int *fa = nullptr, *qerr = nullptr;
        size_t *lim = nullptr;
        REQUIRE(cudaMalloc(&fa, 16 * sizeof(int)));
        REQUIRE(cudaMalloc(&qerr, 16 * sizeof(int)));
        REQUIRE(cudaMalloc(&lim, 4 * sizeof(size_t)));
        REQUIRE(cudaMemset(qerr, 0xff, 16 * sizeof(int)));
        runtime_queries<<<1, 1>>>(fa, lim, qerr);
        CHECK_CUDA("a kernel asking the device runtime about kernels and limits", cudaDeviceSynchronize());
        int d[16], e[16];
        size_t l[4];
        REQUIRE(cudaMemcpy(d, fa, sizeof d, cudaMemcpyDeviceToHost));
        REQUIRE(cudaMemcpy(e, qerr, sizeof e, cudaMemcpyDeviceToHost));
        REQUIRE(cudaMemcpy(l, lim, sizeof l, cudaMemcpyDeviceToHost));
        cudaFuncAttributes h;
        REQUIRE(cudaFuncGetAttributes(&h, child));
        int occ = 0;
        REQUIRE(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, child, 128, 0));
        bool calls_ok = true;
        for (int i = 0; i < 8; ++i) calls_ok = calls_ok && e[i] == 0;
        CHECK("a kernel reads a kernel's attributes as the host does", calls_ok && d[0] == h.maxThreadsPerBlock &&
              d[1] == h.numRegs && d[2] == (int)h.sharedSizeBytes && d[3] == h.ptxVersion &&
              d[4] == h.binaryVersion && d[5] == (int)h.localSizeBytes,
              "errors %d %d; threads %d/%d, regs %d/%d, shared %d/%zu, ptx %d/%d, binary %d/%d, local %d/%zu", e[0],
              e[1], d[0], h.maxThreadsPerBlock, d[1], h.numRegs, d[2], h.sharedSizeBytes, d[3], h.ptxVersion, d[4],
              h.binaryVersion, d[5], h.localSizeBytes);
        CHECK("and its occupancy", d[6] == occ && occ > 0, "%d, host %d", d[6], occ);
        size_t heap = 0, pending = 0, depth = 0, fifo = 0;
        REQUIRE(cudaDeviceGetLimit(&heap, cudaLimitMallocHeapSize));
        REQUIRE(cudaDeviceGetLimit(&pending, cudaLimitDevRuntimePendingLaunchCount));
        REQUIRE(cudaDeviceGetLimit(&depth, cudaLimitDevRuntimeSyncDepth));
        REQUIRE(cudaDeviceGetLimit(&fifo, cudaLimitPrintfFifoSize));
        CHECK("a kernel reads the limits the host reads", l[0] == heap && l[1] == pending && l[2] == depth &&
              l[3] == fifo,
              "heap %zu/%zu, pending %zu/%zu, sync depth %zu/%zu, printf FIFO %zu/%zu", l[0], heap, l[1], pending,
              l[2], depth, l[3], fifo);
        CHECK("and the cache and bank configuration", d[7] == cudaFuncCachePreferNone &&
              d[8] == cudaSharedMemBankSizeFourByte, "%d %d", d[7], d[8]);
        CHECK("the attributes of what is not a kernel are refused", e[8] != 0, "%d", e[8]);
        CUDA_OK(cudaFree(fa));
        CUDA_OK(cudaFree(qerr));
        CUDA_OK(cudaFree(lim));
    }

    int *levels = nullptr, *errs = nullptr;
    REQUIRE(cudaMalloc(&levels, 64 * sizeof(int)));
    REQUIRE(cudaMalloc(&errs, 64 * sizeof(int)));
    REQUIRE(cudaMemset(levels, 0, 64 * sizeof(int)));
    REQUIRE(cudaMemset(errs, 0, 64 * sizeof(int)));
    nested<<<1, 1>>>(levels, errs, 0, 12);
    REQUIRE(cudaDeviceSynchronize());
    std::vector<int> lv(64), ev(64);
    REQUIRE(cudaMemcpy(lv.data(), levels, 64 * sizeof(int), cudaMemcpyDeviceToHost));
    REQUIRE(cudaMemcpy(ev.data(), errs, 64 * sizeof(int), cudaMemcpyDeviceToHost));
    bool chain = true;
    for (int d = 0; d < 12; d++) chain = chain && lv[d] == d + 1 && (d == 11 || ev[d] == 0);
    CHECK("launches nest twelve deep", chain, "levels %d %d .. %d", lv[0], lv[1], lv[11]);

    // CUDA's limit: a grid at depth 24 cannot launch.
    REQUIRE(cudaMemset(levels, 0, 64 * sizeof(int)));
    nested<<<1, 1>>>(levels, errs, 0, 40);
    REQUIRE(cudaDeviceSynchronize());
    REQUIRE(cudaMemcpy(lv.data(), levels, 64 * sizeof(int), cudaMemcpyDeviceToHost));
    REQUIRE(cudaMemcpy(ev.data(), errs, 64 * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK("a launch past the nesting limit fails with cudaErrorLaunchMaxDepthExceeded",
          lv[24] == 25 && lv[25] == 0 && ev[24] == cudaErrorLaunchMaxDepthExceeded, "levels[24] %d, [25] %d, err %d",
          lv[24], lv[25], ev[24]);

    // The device runtime's limits, as CUDA's samples set them before they launch.
    CHECK_CUDA("cudaDeviceSetLimit(cudaLimitDevRuntimeSyncDepth, 4)", cudaDeviceSetLimit(cudaLimitDevRuntimeSyncDepth, 4));
    size_t lim = 0;
    REQUIRE(cudaDeviceGetLimit(&lim, cudaLimitDevRuntimeSyncDepth));
    CHECK("cudaDeviceGetLimit reads the sync depth back", lim == 4, "%zu", lim);
    // 4096 children at once may pass CUDA's default of 2048 pending launches (on the simulated
    // GPU they do: children run after their parent): at least that many run...
    const int many = 4096;
    int *fan = nullptr;
    REQUIRE(cudaMalloc(&fan, many * sizeof(int)));
    REQUIRE(cudaMemset(fan, 0xff, many * sizeof(int)));
    fan_out<<<many / 256, 256>>>(fan);
    REQUIRE(cudaDeviceSynchronize());
    std::vector<int> fv(many);
    REQUIRE(cudaMemcpy(fv.data(), fan, many * sizeof(int), cudaMemcpyDeviceToHost));
    int ran = 0;
    for (int i = 0; i < many; i++) ran += fv[i] == 3 * i + 1;
    printf("# %d of %d children ran under the default pending launch limit\n", ran, many);
    CHECK("under CUDA's default pending launch limit at least 2048 children run", ran >= 2048, "%d of %d ran",
          ran, many);
    // ... and with the limit raised, all of them.
    CHECK_CUDA("cudaDeviceSetLimit(cudaLimitDevRuntimePendingLaunchCount, 8192)",
               cudaDeviceSetLimit(cudaLimitDevRuntimePendingLaunchCount, 8192));
    REQUIRE(cudaDeviceGetLimit(&lim, cudaLimitDevRuntimePendingLaunchCount));
    CHECK("cudaDeviceGetLimit reads the pending launch count back", lim == 8192, "%zu", lim);
    REQUIRE(cudaMemset(fan, 0xff, many * sizeof(int)));
    fan_out<<<many / 256, 256>>>(fan);
    REQUIRE(cudaDeviceSynchronize());
    REQUIRE(cudaMemcpy(fv.data(), fan, many * sizeof(int), cudaMemcpyDeviceToHost));
    ran = 0;
    for (int i = 0; i < many; i++) ran += fv[i] == 3 * i + 1;
    CHECK("with the limit raised every child runs", ran == many, "%d of %d ran", ran, many);
    CUDA_OK(cudaFree(fan));

    int *err = nullptr;
    REQUIRE(cudaMalloc(&err, sizeof(int)));
    REQUIRE(cudaMemset(out, 0xff, n * sizeof(int)));
    bad_config<<<1, 1>>>(out, err);
    CHECK_CUDA("a bad child configuration does not fail the parent", cudaDeviceSynchronize());
    int e = 0;
    REQUIRE(cudaMemcpy(&e, err, sizeof e, cudaMemcpyDeviceToHost));
    REQUIRE(cudaMemcpy(h.data(), out, n * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK("the kernel sees cudaErrorInvalidConfiguration and nothing runs",
          e == cudaErrorInvalidConfiguration && h[0] == -1, "err %d, out[0] %d", e, h[0]);

    CUDA_OK(cudaFree(out));
    CUDA_OK(cudaFree(cell));
    CUDA_OK(cudaFree(dv));
    CUDA_OK(cudaFree(levels));
    CUDA_OK(cudaFree(errs));
    CUDA_OK(cudaFree(err));
    return finish_summary();
}
