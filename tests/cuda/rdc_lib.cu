// The other translation unit of rdc_main.cu: a device function and a __device__ variable that
// the first unit's kernel uses, and the host code that sets the variable.
#include <cuda_runtime.h>

#include "rdc_common.cuh"

__device__ int offset;

__device__ int scale(int x) { return 3 * x; }

__device__ int coded(int x) { return code_of(x + 1) * 10 + twice(x); }

void set_offset(int v) { cudaMemcpyToSymbol(offset, &v, sizeof v); }
