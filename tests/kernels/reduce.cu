// Block and warp reductions.
#define FULL_MASK 0xffffffffu

// Tree reduction in shared memory with __syncthreads; blockDim must be 256.
// Each thread first adds two elements; one partial sum per block.
extern "C" __global__ void reduce_block_sum(const int* in, int* block_sums, int n)
{
    __shared__ int s[256];
    unsigned tid = threadIdx.x;
    unsigned i = blockIdx.x * blockDim.x * 2 + tid;
    int v = 0;
    if (i < n) v = in[i];
    if (i + blockDim.x < n) v += in[i + blockDim.x];
    s[tid] = v;
    __syncthreads();
    for (unsigned stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (tid < stride) {
            s[tid] += s[tid + stride];
        }
        __syncthreads();
    }
    if (tid == 0) {
        block_sums[blockIdx.x] = s[0];
    }
}

__device__ __forceinline__ unsigned warp_sum_down(unsigned v)
{
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(FULL_MASK, v, offset);
    }
    return v;
}

// Grid-stride accumulation, then __shfl_down_sync within each warp and a second
// warp-level pass over the per-warp sums. blockDim must be a multiple of 32.
extern "C" __global__ void reduce_warp_shfl_down(const unsigned* in, unsigned* block_sums, unsigned n)
{
    __shared__ unsigned warp_sums[32];
    unsigned v = 0;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        v += in[i];
    }
    v = warp_sum_down(v);
    unsigned lane = threadIdx.x & 31;
    unsigned warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = (lane < blockDim.x / 32) ? warp_sums[lane] : 0;
        v = warp_sum_down(v);
        if (lane == 0) block_sums[blockIdx.x] = v;
    }
}

// Butterfly (__shfl_xor_sync) max: every lane ends up with its warp's maximum
// and writes it. Threads past n contribute -inf. blockDim must be a multiple of 32.
extern "C" __global__ void reduce_warp_shfl_xor(const float* in, float* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = (i < n) ? in[i] : -__int_as_float(0x7f800000);
    for (int mask = 16; mask > 0; mask >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, mask));
    }
    if (i < n) out[i] = v;
}
