// CUDA runtime basics: device queries, memory round trips, memset, pinned
// host memory, and error reporting. Self-checking: one `ok`/`FAIL` line per
// check, exit status 1 if anything failed.
#include "check.h"

#include <vector>

// A trivial kernel so the program's fatbin is not empty and the runtime loads
// a module; also proves the context works after the error checks.
__global__ void add_one(int *p, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += 1;
}

static void device_queries()
{
    int count = -1;
    cudaError_t e = cudaGetDeviceCount(&count);
    CHECK("cudaGetDeviceCount succeeds", e == cudaSuccess, "%s (%d): %s", cudaGetErrorName(e),
          (int)e, cudaGetErrorString(e));
    if (e != cudaSuccess) {
        printf("# stopping: no usable CUDA device\n");
        exit(finish());
    }
    CHECK("at least one device", count >= 1, "count = %d", count);

    cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    REQUIRE(cudaGetDeviceProperties(&prop, 0));
    printf("# device 0: %s, cc %d.%d, %zu bytes, %d SMs\n", prop.name, prop.major, prop.minor,
           prop.totalGlobalMem, prop.multiProcessorCount);
    CHECK("device name is set", prop.name[0] != '\0', "empty name");
    CHECK("totalGlobalMem > 16 MiB", prop.totalGlobalMem > (16u << 20), "%zu",
          prop.totalGlobalMem);
    CHECK("warpSize is 32", prop.warpSize == 32, "%d", prop.warpSize);
    CHECK("maxThreadsPerBlock >= 256", prop.maxThreadsPerBlock >= 256, "%d",
          prop.maxThreadsPerBlock);
    CHECK("maxThreadsDim sane",
          prop.maxThreadsDim[0] >= 256 && prop.maxThreadsDim[1] >= 256 && prop.maxThreadsDim[2] >= 1,
          "%d x %d x %d", prop.maxThreadsDim[0], prop.maxThreadsDim[1], prop.maxThreadsDim[2]);
    CHECK("maxGridSize sane", prop.maxGridSize[0] >= 65535 && prop.maxGridSize[1] >= 65535,
          "%d x %d x %d", prop.maxGridSize[0], prop.maxGridSize[1], prop.maxGridSize[2]);
    CHECK("multiProcessorCount >= 1", prop.multiProcessorCount >= 1, "%d",
          prop.multiProcessorCount);
    CHECK("compute capability >= 5.2", prop.major > 5 || (prop.major == 5 && prop.minor >= 2),
          "%d.%d", prop.major, prop.minor);
    CHECK("sharedMemPerBlock >= 16 KiB", prop.sharedMemPerBlock >= 16384, "%zu",
          prop.sharedMemPerBlock);

    e = cudaGetDeviceProperties(&prop, count);
    CHECK("cudaGetDeviceProperties(count) fails with cudaErrorInvalidDevice",
          e == cudaErrorInvalidDevice, "%s (%d)", cudaGetErrorName(e), (int)e);
    cudaGetLastError();

    size_t free_b = 0, total_b = 0;
    e = cudaMemGetInfo(&free_b, &total_b);
    CHECK("cudaMemGetInfo succeeds", e == cudaSuccess, "%s (%d)", cudaGetErrorName(e), (int)e);
    printf("# cudaMemGetInfo: free %zu, total %zu\n", free_b, total_b);
    CHECK("cudaMemGetInfo: 0 < free <= total", free_b > 0 && free_b <= total_b,
          "free %zu total %zu", free_b, total_b);
}

static void memory_round_trips()
{
    const size_t n = 256 * 1024;  // 1 MiB of ints
    const size_t bytes = n * sizeof(int);
    std::vector<int> host(n), back(n, 0);
    for (size_t i = 0; i < n; ++i) host[i] = (int)(i * 2654435761u);

    size_t free_before = 0, total = 0;
    CUDA_OK(cudaMemGetInfo(&free_before, &total));

    int *a = nullptr, *b = nullptr;
    REQUIRE(cudaMalloc(&a, bytes));
    REQUIRE(cudaMalloc(&b, bytes));
    CHECK("cudaMalloc returns distinct non-null pointers", a && b && a != b, "%p %p", (void *)a,
          (void *)b);
    CHECK("cudaMalloc pointer is 256-byte aligned", ((uintptr_t)a & 255) == 0, "%p", (void *)a);

    size_t free_after = 0;
    CUDA_OK(cudaMemGetInfo(&free_after, &total));
    CHECK("cudaMemGetInfo: free does not grow after cudaMalloc", free_after <= free_before,
          "before %zu after %zu", free_before, free_after);

    CHECK_CUDA("cudaMemcpy host to device (1 MiB)",
               cudaMemcpy(a, host.data(), bytes, cudaMemcpyHostToDevice));
    CHECK_CUDA("cudaMemcpy device to device (1 MiB)",
               cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    CHECK_CUDA("cudaMemcpy device to host (1 MiB)",
               cudaMemcpy(back.data(), b, bytes, cudaMemcpyDeviceToHost));
    long bad = first_mismatch(back.data(), host.data(), (long)n);
    CHECK("H2D, D2D, D2H round trip preserves data", bad < 0, "index %ld: got %d want %d", bad,
          bad < 0 ? 0 : back[bad], bad < 0 ? 0 : host[bad]);

    // Unaligned sub-range copy: bytes 3..1003 of a into b at offset 5.
    std::vector<unsigned char> pattern(1000), got(1000);
    for (int i = 0; i < 1000; ++i) pattern[i] = (unsigned char)(i * 7 + 1);
    CUDA_OK(cudaMemcpy((char *)a + 3, pattern.data(), 1000, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy((char *)b + 5, (char *)a + 3, 1000, cudaMemcpyDeviceToDevice));
    CUDA_OK(cudaMemcpy(got.data(), (char *)b + 5, 1000, cudaMemcpyDeviceToHost));
    bad = first_mismatch(got.data(), pattern.data(), 1000);
    CHECK("unaligned sub-range copies", bad < 0, "byte %ld: got %u want %u", bad,
          bad < 0 ? 0u : got[bad], bad < 0 ? 0u : pattern[bad]);

    // cudaMemset: whole buffer, then a middle range.
    CHECK_CUDA("cudaMemset whole buffer", cudaMemset(a, 0xAB, bytes));
    CHECK_CUDA("cudaMemset middle range", cudaMemset((char *)a + 1001, 0x00, 4000));
    std::vector<unsigned char> bytes_back(bytes);
    CUDA_OK(cudaMemcpy(bytes_back.data(), a, bytes, cudaMemcpyDeviceToHost));
    long wrong = -1;
    for (size_t i = 0; i < bytes; ++i) {
        unsigned char want = (i >= 1001 && i < 5001) ? 0x00 : 0xAB;
        if (bytes_back[i] != want) { wrong = (long)i; break; }
    }
    CHECK("cudaMemset values read back", wrong < 0, "byte %ld = 0x%02x", wrong,
          wrong < 0 ? 0u : bytes_back[wrong]);

    // A kernel over the memset buffer: every int +1.
    CUDA_OK(cudaMemset(a, 0, bytes));
    add_one<<<(unsigned)((n + 255) / 256), 256>>>(a, (int)n);
    CHECK_CUDA("add_one launch", cudaGetLastError());
    CHECK_CUDA("cudaDeviceSynchronize after add_one", cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(back.data(), a, bytes, cudaMemcpyDeviceToHost));
    long not_one = -1;
    for (size_t i = 0; i < n; ++i)
        if (back[i] != 1) { not_one = (long)i; break; }
    CHECK("kernel sees memset memory and writes back", not_one < 0, "index %ld = %d", not_one,
          not_one < 0 ? 0 : back[not_one]);

    CHECK_CUDA("cudaFree a", cudaFree(a));
    CHECK_CUDA("cudaFree b", cudaFree(b));
    CHECK_CUDA("cudaFree(nullptr) is a no-op", cudaFree(nullptr));
}

static void pinned_memory()
{
    const size_t n = 64 * 1024;
    const size_t bytes = n * sizeof(float);
    float *ph = nullptr, *pb = nullptr, *d = nullptr;
    CHECK_CUDA("cudaMallocHost", cudaMallocHost(&ph, bytes));
    CHECK_CUDA("cudaMallocHost second buffer", cudaMallocHost(&pb, bytes));
    if (!ph || !pb) return;
    for (size_t i = 0; i < n; ++i) { ph[i] = (float)i * 0.5f - 7.0f; pb[i] = 0.0f; }
    REQUIRE(cudaMalloc(&d, bytes));
    CUDA_OK(cudaMemcpy(d, ph, bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(pb, d, bytes, cudaMemcpyDeviceToHost));
    long bad = first_mismatch(pb, ph, (long)n);
    CHECK("pinned host round trip", bad < 0, "index %ld: got %g want %g", bad,
          bad < 0 ? 0.0 : pb[bad], bad < 0 ? 0.0 : ph[bad]);
    CUDA_OK(cudaFree(d));
    CHECK_CUDA("cudaFreeHost", cudaFreeHost(ph));
    CHECK_CUDA("cudaFreeHost second buffer", cudaFreeHost(pb));
}

static void error_reporting()
{
    // Error strings and names for well-known codes.
    const char *s = cudaGetErrorString(cudaErrorInvalidValue);
    CHECK("cudaGetErrorString(cudaErrorInvalidValue)", s && strstr(s, "invalid argument"),
          "\"%s\"", s ? s : "(null)");
    const char *nm = cudaGetErrorName(cudaErrorMemoryAllocation);
    CHECK("cudaGetErrorName(cudaErrorMemoryAllocation)",
          nm && strcmp(nm, "cudaErrorMemoryAllocation") == 0, "\"%s\"", nm ? nm : "(null)");
    s = cudaGetErrorString(cudaSuccess);
    CHECK("cudaGetErrorString(cudaSuccess)", s && strstr(s, "no error"), "\"%s\"",
          s ? s : "(null)");

    CHECK_CUDA("cudaGetLastError starts clean", cudaGetLastError());

    int host[16] = {0};
    int *d = nullptr;
    REQUIRE(cudaMalloc(&d, sizeof host));

    // Invalid direction: the runtime rejects it and records it as last error.
    cudaError_t e = cudaMemcpy(d, host, sizeof host, (cudaMemcpyKind)99);
    CHECK("cudaMemcpy with invalid direction fails with cudaErrorInvalidMemcpyDirection",
          e == cudaErrorInvalidMemcpyDirection, "%s (%d)", cudaGetErrorName(e), (int)e);
    cudaError_t last = cudaGetLastError();
    CHECK("cudaGetLastError returns the memcpy error", last == e, "%s (%d)",
          cudaGetErrorName(last), (int)last);
    last = cudaGetLastError();
    CHECK("cudaGetLastError resets to cudaSuccess", last == cudaSuccess, "%s (%d)",
          cudaGetErrorName(last), (int)last);

    // A device pointer that was never allocated.
    e = cudaMemcpy(host, (void *)0x10, sizeof host, cudaMemcpyDeviceToHost);
    CHECK("cudaMemcpy from an unallocated device pointer fails", e != cudaSuccess,
          "returned cudaSuccess");
    printf("# cudaMemcpy from 0x10 returned %s (%d)\n", cudaGetErrorName(e), (int)e);
    cudaGetLastError();

    // Freeing a pointer that cudaMalloc did not return.
    e = cudaFree((char *)d + 4);
    CHECK("cudaFree of an interior pointer fails", e != cudaSuccess, "returned cudaSuccess");
    printf("# cudaFree(d + 4) returned %s (%d)\n", cudaGetErrorName(e), (int)e);
    cudaGetLastError();

    // An allocation far larger than any device.
    void *huge = nullptr;
    e = cudaMalloc(&huge, (size_t)1 << 50);
    CHECK("cudaMalloc(1 PiB) fails with cudaErrorMemoryAllocation",
          e == cudaErrorMemoryAllocation, "%s (%d)", cudaGetErrorName(e), (int)e);
    last = cudaGetLastError();
    CHECK("cudaGetLastError returns cudaErrorMemoryAllocation once",
          last == cudaErrorMemoryAllocation && cudaGetLastError() == cudaSuccess, "%s (%d)",
          cudaGetErrorName(last), (int)last);

    // None of these errors is sticky: the context still works.
    for (int i = 0; i < 16; ++i) host[i] = i * i;
    int back[16] = {0};
    bool fine = CUDA_OK(cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice)) &&
                CUDA_OK(cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost));
    CHECK("context still usable after non-sticky errors",
          fine && memcmp(back, host, sizeof host) == 0, "copy failed or data differs");
    CHECK_CUDA("cudaDeviceSynchronize after errors", cudaDeviceSynchronize());
    CUDA_OK(cudaFree(d));
}

int main(int argc, char **argv)
{
    (void)argc;
    g_program = "runtime_basics";
    (void)argv;
    device_queries();
    memory_round_trips();
    pinned_memory();
    error_reporting();
    return finish();
}
