// Separate compilation (nvcc -rdc=true) with PTX only: a kernel of this unit calls a device
// function and reads a __device__ variable that another unit (rdc_lib.cu) defines. NVIDIA's
// runtime registers the units' relocatable images together (a version-2 fat binary wrapper,
// with libcudadevrt's image beside them); the driver links them when it loads the module.
#include "check.h"
#include "rdc_common.cuh"

extern __device__ int scale(int x);
extern __device__ int coded(int x);
extern __device__ int offset;

__global__ void apply(int *p, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = scale(i) + offset;
}

// Both units' copies of the inline function's table and of the template's code.
__global__ void apply_shared(int *p, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = code_of(i) * 1000 + twice(i) * 100000 + coded(i);
}

static int code_host(int i) { return (i & 3) == 0 || (i & 3) == 3 ? 3 : 4; }

void set_offset(int v);

int main()
{
    const int n = 1000;
    int *d = nullptr;
    REQUIRE(cudaMalloc(&d, n * sizeof(int)));
    set_offset(7);
    apply<<<(n + 127) / 128, 128>>>(d, n);
    CHECK_CUDA("the kernel calling another unit's function launches", cudaGetLastError());
    int h[n];
    CHECK_CUDA("its results come back", cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    int want[n];
    for (int i = 0; i < n; i++) want[i] = 3 * i + 7;
    long bad = first_mismatch(h, want, n);
    CHECK("another unit's device function and variable are linked in", bad < 0, "first mismatch at %ld", bad);
    apply_shared<<<(n + 127) / 128, 128>>>(d, n);
    CHECK_CUDA("a kernel using inline code both units define (weak) launches", cudaGetLastError());
    CHECK_CUDA("its results come back", cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        want[i] = code_host(i) * 1000 + 2 * i * 100000 + code_host(i + 1) * 10 + 2 * i;
    bad = first_mismatch(h, want, n);
    CHECK("both units' weak definitions are linked once", bad < 0, "first mismatch at %ld", bad);
    cudaFree(d);
    return finish();
}
