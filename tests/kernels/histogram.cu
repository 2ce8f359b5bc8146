// 256-bin byte histograms with atomics.
#define BINS 256

// Every element does one atomicAdd on global memory.
extern "C" __global__ void histogram_global(const unsigned char* data, unsigned n, unsigned* bins)
{
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        atomicAdd(&bins[data[i]], 1u);
    }
}

// Per-block histogram with shared-memory atomics, merged into global bins.
extern "C" __global__ void histogram_shared(const unsigned char* data, unsigned n, unsigned* bins)
{
    __shared__ unsigned local[BINS];
    for (unsigned t = threadIdx.x; t < BINS; t += blockDim.x) local[t] = 0;
    __syncthreads();
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        atomicAdd(&local[data[i]], 1u);
    }
    __syncthreads();
    for (unsigned t = threadIdx.x; t < BINS; t += blockDim.x) {
        if (local[t] != 0) atomicAdd(&bins[t], local[t]);
    }
}
