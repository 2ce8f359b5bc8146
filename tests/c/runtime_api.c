/* The CUDA runtime API through NVIDIA's own libcudart (linked by the test
 * against PyPI's libcudart.so.12) on vgpu's libcuda.so.1: initialisation
 * (export tables, the integrity check), devices, the VM's slice, memory,
 * asynchronous copies, streams, events and error reporting. Prints
 * "ok <what>" or "FAIL <what>: <details>" per check. */
#include <stdio.h>
#include <string.h>
#include <cuda_runtime_api.h>

static int failed;

static void check(int cond, const char *what, cudaError_t e) {
    if (cond) {
        printf("ok %s\n", what);
    } else {
        failed++;
        printf("FAIL %s: %s (%d)\n", what, cudaGetErrorName(e), (int)e);
    }
}

#define OK(call, what) do { cudaError_t e_ = (call); check(e_ == cudaSuccess, what, e_); } while (0)

int main(void) {
    int n = 0, v = 0;
    OK(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    check(n == 1, "one device", cudaSuccess);
    OK(cudaDriverGetVersion(&v), "cudaDriverGetVersion");
    check(v >= 12000, "driver version is CUDA 12 or newer", cudaSuccess);
    struct cudaDeviceProp p;
    OK(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
    printf("# device: %s, cc %d.%d, %zu bytes\n", p.name, p.major, p.minor, p.totalGlobalMem);
    size_t free_b = 0, total = 0;
    OK(cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo");
    printf("total %zu\n", total);

    enum { N = 1 << 16 };
    static unsigned int h[N], back[N];
    for (int i = 0; i < N; i++) h[i] = 0x9E3779B9u * (unsigned)i;
    unsigned int *d = NULL, *d2 = NULL;
    OK(cudaMalloc((void **)&d, sizeof h), "cudaMalloc");
    OK(cudaMalloc((void **)&d2, sizeof h), "cudaMalloc second");
    size_t free_after = 0;
    OK(cudaMemGetInfo(&free_after, &total), "cudaMemGetInfo after allocation");
    check(free_b - free_after >= 2 * sizeof h, "allocations are charged to the slice", cudaSuccess);
    OK(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
    OK(cudaMemcpy(d2, d, sizeof h, cudaMemcpyDeviceToDevice), "cudaMemcpy on the device");
    OK(cudaMemcpy(back, d2, sizeof h, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
    check(memcmp(h, back, sizeof h) == 0, "data round trip", cudaSuccess);

    cudaStream_t s;
    cudaEvent_t a, b;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    OK(cudaEventCreate(&a), "cudaEventCreate");
    OK(cudaEventCreate(&b), "cudaEventCreate second");
    OK(cudaEventRecord(a, s), "cudaEventRecord");
    OK(cudaMemsetAsync(d, 0x5A, sizeof h, s), "cudaMemsetAsync");
    OK(cudaMemcpyAsync(back, d, sizeof h, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
    OK(cudaEventRecord(b, s), "cudaEventRecord second");
    OK(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    check(back[0] == 0x5A5A5A5Au && back[N - 1] == 0x5A5A5A5Au, "memset seen after the stream", cudaSuccess);
    float ms = -1;
    OK(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    check(ms >= 0, "elapsed time is not negative", cudaSuccess);

    cudaError_t e = cudaMemcpy(back, (void *)16, 4, cudaMemcpyDeviceToHost);
    check(e != cudaSuccess, "a copy from a foreign pointer is refused", e);
    cudaGetLastError();
    e = cudaMalloc((void **)&d2, total * 2);
    check(e == cudaErrorMemoryAllocation, "an allocation past the slice fails", e);
    cudaGetLastError();

    OK(cudaEventDestroy(a), "cudaEventDestroy");
    OK(cudaEventDestroy(b), "cudaEventDestroy second");
    OK(cudaStreamDestroy(s), "cudaStreamDestroy");
    OK(cudaFree(d), "cudaFree");
    OK(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    OK(cudaDeviceReset(), "cudaDeviceReset");
    /* The runtime initialises again in a fresh primary context. */
    OK(cudaMalloc((void **)&d, 4096), "cudaMalloc after reset");
    OK(cudaFree(d), "cudaFree after reset");
    printf("# runtime_api: %d failed\n", failed);
    return failed != 0;
}
