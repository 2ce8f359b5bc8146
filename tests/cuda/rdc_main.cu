// Separate compilation (nvcc -rdc=true) with PTX only: a kernel of this unit calls a device
// function and reads a __device__ variable that another unit (rdc_lib.cu) defines. NVIDIA's
// runtime registers the units' relocatable images together (a version-2 fat binary wrapper,
// with libcudadevrt's image beside them); the driver links them when it loads the module.
#include "check.h"

extern __device__ int scale(int x);
extern __device__ int offset;

__global__ void apply(int *p, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = scale(i) + offset;
}

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
    cudaFree(d);
    return finish();
}
