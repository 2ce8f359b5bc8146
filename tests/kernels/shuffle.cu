// Warp shuffle variants: indexed, up, down with sub-warp width, xor. blockDim multiple of 32.
#define FULL_MASK 0xffffffffu

extern "C" __global__ void shfl_variants(const int* in, int* out)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int lane = threadIdx.x & 31;
    int v = in[i];
    int* o = out + i * 5;
    o[0] = __shfl_sync(FULL_MASK, v, (lane * 7 + 3) & 31);   // arbitrary permutation
    o[1] = __shfl_up_sync(FULL_MASK, v, 3);                  // lanes < 3 keep their own value
    o[2] = __shfl_down_sync(FULL_MASK, v, 2, 8);             // within 8-lane segments
    o[3] = __shfl_xor_sync(FULL_MASK, v, 5);
    o[4] = __shfl_sync(FULL_MASK, v, 1, 4);                  // broadcast lane 1 of each 4-lane segment
}
