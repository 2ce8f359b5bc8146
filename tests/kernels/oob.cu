// A kernel that stores far outside any allocation: must fail with
// CUDA_ERROR_ILLEGAL_ADDRESS (700), at the launch or the next synchronize.
extern "C" __global__ void oob_write(int* p, long long offset, int value)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        p[offset] = value;
    } else {
        p[threadIdx.x] = value;
    }
}
