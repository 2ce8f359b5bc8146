// __constant__ memory and __device__ globals, accessed through module globals.

// Filled by the host with cuModuleGetGlobal + cuMemcpyHtoD before launch.
__constant__ float c_coeffs[9];

// Statically initialised; the host reads it back to check the module loader
// applied the initializer (keep in sync with CONST_TABLE in the corpus crate).
__constant__ int c_table[16] = {3, -1, 4, -1, 5, -9, 2, 6, -5, 3, 5, -8, 9, 7, -9, 3};

// A writable device global counting how many elements const_table processed.
__device__ unsigned g_counter;

// 9-tap convolution with zero padding, taps from constant memory.
extern "C" __global__ void const_conv(const float* in, float* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float acc = 0.0f;
    for (int k = 0; k < 9; ++k) {
        int j = i + k - 4;
        if (j >= 0 && j < n) acc += c_coeffs[k] * in[j];
    }
    out[i] = acc;
}

// Data-dependent constant-table lookups.
extern "C" __global__ void const_table(const unsigned* in, int* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned v = in[i];
    out[i] = c_table[v & 15] * (int)(v >> 4) + c_table[(v >> 8) & 15];
    atomicAdd(&g_counter, 1u);
}
