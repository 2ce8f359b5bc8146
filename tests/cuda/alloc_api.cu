// The allocation APIs through NVIDIA's runtime: cudaMallocAsync/cudaFreeAsync and memory
// pools, cudaMallocManaged (one pointer on host and device), cudaHostAlloc(Mapped) zero-copy
// memory and cudaHostRegister(Mapped), cudaPointerGetAttributes.
// Self-checking: one `ok`/`FAIL` line per check, exit status 1 if anything failed.
#include "check.h"

__global__ void increment(int *p, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += 1;
}

__global__ void square_into(const int *in, int *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * in[i];
}

static void test_mapped()
{
    const int n = 4096;
    REQUIRE(cudaSetDeviceFlags(cudaDeviceMapHost));
    int can_map = 0;
    CHECK_CUDA("cudaDeviceGetAttribute canMapHostMemory",
               cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, 0));
    CHECK("the device maps host memory", can_map == 1, "%d", can_map);
    int *in = nullptr, *out = nullptr;
    CHECK_CUDA("cudaHostAlloc(Mapped)", cudaHostAlloc((void **)&in, n * sizeof(int), cudaHostAllocMapped));
    CHECK_CUDA("cudaHostAlloc(Mapped|Portable|WriteCombined)",
               cudaHostAlloc((void **)&out, n * sizeof(int),
                             cudaHostAllocMapped | cudaHostAllocPortable | cudaHostAllocWriteCombined));
    unsigned flags = 0;
    CHECK_CUDA("cudaHostGetFlags", cudaHostGetFlags(&flags, out));
    CHECK("the flags are the ones given", flags == 7, "%u", flags);
    for (int i = 0; i < n; ++i) in[i] = i;
    int *din = nullptr, *dout = nullptr;
    CHECK_CUDA("cudaHostGetDevicePointer in", cudaHostGetDevicePointer((void **)&din, in, 0));
    CHECK_CUDA("cudaHostGetDevicePointer out", cudaHostGetDevicePointer((void **)&dout, out, 0));
    square_into<<<n / 256, 256>>>(din, dout, n);
    CHECK_CUDA("kernel on zero-copy memory", cudaGetLastError());
    CHECK_CUDA("cudaDeviceSynchronize", cudaDeviceSynchronize());
    long bad = -1;
    for (int i = 0; i < n && bad < 0; ++i)
        if (out[i] != i * i) bad = i;
    CHECK("the host sees the kernel's writes to mapped memory", bad < 0, "first bad %ld", bad);
    cudaPointerAttributes a;
    CHECK_CUDA("cudaPointerGetAttributes mapped", cudaPointerGetAttributes(&a, in));
    CHECK("mapped memory is host memory", a.type == cudaMemoryTypeHost && a.devicePointer == din,
          "type %d", (int)a.type);
    CHECK_CUDA("cudaFreeHost in", cudaFreeHost(in));
    CHECK_CUDA("cudaFreeHost out", cudaFreeHost(out));

    int *mine = (int *)aligned_alloc(4096, n * sizeof(int));
    for (int i = 0; i < n; ++i) mine[i] = 10 * i;
    CHECK_CUDA("cudaHostRegister(Mapped)", cudaHostRegister(mine, n * sizeof(int), cudaHostRegisterMapped));
    int *dmine = nullptr;
    CHECK_CUDA("its device pointer", cudaHostGetDevicePointer((void **)&dmine, mine, 0));
    increment<<<n / 256, 256>>>(dmine, n);
    CHECK_CUDA("synchronize registered", cudaDeviceSynchronize());
    CHECK("the kernel wrote the program's own memory", mine[0] == 1 && mine[n - 1] == 10 * (n - 1) + 1,
          "%d %d", mine[0], mine[n - 1]);
    CHECK_CUDA("cudaHostUnregister", cudaHostUnregister(mine));
    free(mine);
}

static void test_managed()
{
    const int n = 1 << 16;
    int managed = 0, concurrent = -1;
    CHECK_CUDA("managedMemory attribute", cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, 0));
    CHECK_CUDA("concurrentManagedAccess attribute",
               cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0));
    CHECK("managed memory without concurrent access", managed == 1 && concurrent == 0, "%d %d",
          managed, concurrent);
    int *p = nullptr;
    CHECK_CUDA("cudaMallocManaged", cudaMallocManaged(&p, n * sizeof(int)));
    for (int i = 0; i < n; ++i) p[i] = i;
    increment<<<n / 256, 256>>>(p, n);
    increment<<<n / 256, 256>>>(p, n);
    CHECK_CUDA("cudaDeviceSynchronize", cudaDeviceSynchronize());
    long bad = -1;
    for (int i = 0; i < n && bad < 0; ++i)
        if (p[i] != i + 2) bad = i;
    CHECK("host and kernels share one pointer", bad < 0, "first bad %ld: %d", bad, bad < 0 ? 0 : p[bad]);
    cudaPointerAttributes a;
    CHECK_CUDA("cudaPointerGetAttributes managed", cudaPointerGetAttributes(&a, p + 5));
    CHECK("managed memory type", a.type == cudaMemoryTypeManaged, "type %d", (int)a.type);
    CHECK_CUDA("cudaMemAdvise", cudaMemAdvise(p, n * sizeof(int), cudaMemAdviseSetReadMostly, 0));
    CHECK_CUDA("cudaMemPrefetchAsync", cudaMemPrefetchAsync(p, n * sizeof(int), 0, 0));
    int rm = 0;
    CHECK_CUDA("cudaMemRangeGetAttribute",
               cudaMemRangeGetAttribute(&rm, 4, cudaMemRangeAttributeReadMostly, p, n * sizeof(int)));
    CHECK("read mostly", rm == 1, "%d", rm);
    cudaStream_t s;
    REQUIRE(cudaStreamCreate(&s));
    CHECK_CUDA("cudaStreamAttachMemAsync", cudaStreamAttachMemAsync(s, p, 0, cudaMemAttachSingle));
    increment<<<n / 256, 256, 0, s>>>(p, n);
    CHECK_CUDA("cudaStreamSynchronize", cudaStreamSynchronize(s));
    CHECK("the stream's kernel wrote it", p[0] == 3 && p[n - 1] == n + 2, "%d", p[0]);
    int h[4];
    CHECK_CUDA("cudaMemcpy from managed", cudaMemcpy(h, p + 1, sizeof h, cudaMemcpyDefault));
    CHECK("the copy reads it", h[0] == 4 && h[3] == 7, "%d", h[0]);
    CHECK_CUDA("cudaMemset on managed", cudaMemset(p, 0, n * sizeof(int)));
    CHECK("the host sees the memset", p[0] == 0 && p[n - 1] == 0, "%d", p[0]);
    cudaStreamDestroy(s);
    CHECK_CUDA("cudaFree managed", cudaFree(p));
}

static void test_pools()
{
    int pools = 0;
    CHECK_CUDA("memoryPoolsSupported", cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, 0));
    CHECK("pools are supported", pools == 1, "%d", pools);
    size_t free0 = 0, total = 0, free1 = 0;
    REQUIRE(cudaMemGetInfo(&free0, &total));
    cudaStream_t s;
    REQUIRE(cudaStreamCreate(&s));
    const int n = 1 << 18;
    int *d = nullptr;
    CHECK_CUDA("cudaMallocAsync", cudaMallocAsync((void **)&d, n * sizeof(int), s));
    CHECK_CUDA("cudaMemsetAsync", cudaMemsetAsync(d, 0, n * sizeof(int), s));
    increment<<<n / 256, 256, 0, s>>>(d, n);
    int h[2] = {0, 0};
    CHECK_CUDA("cudaMemcpyAsync", cudaMemcpyAsync(h, d + n - 2, sizeof h, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA("cudaStreamSynchronize", cudaStreamSynchronize(s));
    CHECK("stream-ordered memory works", h[0] == 1 && h[1] == 1, "%d %d", h[0], h[1]);
    REQUIRE(cudaMemGetInfo(&free1, &total));
    CHECK("the pool's memory is charged", free0 - free1 >= n * sizeof(int), "%zu -> %zu", free0, free1);
    CHECK_CUDA("cudaFreeAsync", cudaFreeAsync(d, s));
    CHECK_CUDA("cudaStreamSynchronize after free", cudaStreamSynchronize(s));
    REQUIRE(cudaMemGetInfo(&free1, &total));
    CHECK("the default release threshold gives it back at synchronization", free1 == free0,
          "%zu -> %zu", free0, free1);

    cudaMemPool_t pool;
    CHECK_CUDA("cudaDeviceGetDefaultMemPool", cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t threshold = UINT64_MAX;
    CHECK_CUDA("cudaMemPoolSetAttribute release threshold",
               cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    CHECK_CUDA("cudaMallocAsync 2", cudaMallocAsync((void **)&d, n * sizeof(int), s));
    CHECK_CUDA("cudaFreeAsync 2", cudaFreeAsync(d, s));
    CHECK_CUDA("cudaStreamSynchronize 2", cudaStreamSynchronize(s));
    uint64_t reserved = 0, used = 1;
    CHECK_CUDA("reserved", cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
    CHECK_CUDA("used", cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    CHECK("the pool keeps its memory up to the threshold", reserved >= n * sizeof(int) && used == 0,
          "%llu %llu", (unsigned long long)reserved, (unsigned long long)used);
    CHECK_CUDA("cudaMemPoolTrimTo", cudaMemPoolTrimTo(pool, 0));
    REQUIRE(cudaMemGetInfo(&free1, &total));
    CHECK("trimming gives it back", free1 == free0, "%zu -> %zu", free0, free1);

    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t mine;
    CHECK_CUDA("cudaMemPoolCreate", cudaMemPoolCreate(&mine, &props));
    CHECK_CUDA("cudaMallocFromPoolAsync", cudaMallocFromPoolAsync((void **)&d, 1 << 20, mine, s));
    CHECK_CUDA("cudaFreeAsync from pool", cudaFreeAsync(d, s));
    CHECK_CUDA("cudaMemPoolDestroy", cudaMemPoolDestroy(mine));
    CHECK_CUDA("cudaStreamSynchronize 3", cudaStreamSynchronize(s));
    cudaStreamDestroy(s);
}

int main()
{
    g_program = "alloc_api";
    if (!device_present())
        return finish();
    test_mapped();
    test_managed();
    test_pools();
    return finish();
}
