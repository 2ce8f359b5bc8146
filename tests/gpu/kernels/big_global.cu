// A module whose globals (48 MiB) exceed the conformance suite's small VM
// slices: loading it there must fail with CUDA_ERROR_OUT_OF_MEMORY.
__device__ char big_table[48 << 20];

extern "C" __global__ void touch_big(int *out)
{
    out[threadIdx.x] = big_table[threadIdx.x * 4096];
}
