// Kernels and module variables whose layouts devices/cuda reads from a cubin
// (ELF symbol table and .nv.info sections) and from PTX, to compare the two.
// Regenerate layouts.sm_90.cubin and layouts.sm_90.ptx with gen.py.

struct Pair {
    double a;
    char b;
};

__device__ int d_counter;
__device__ float d_table[100];
__constant__ int c_coeffs[16];
__constant__ char c_bytes[3] = {1, 2, 3};

__device__ __noinline__ int helper(int x) { return x * 3 + d_counter; }

extern "C" __global__ void params_mixed(char a, short b, int *c, double d, Pair p, float e,
                                        unsigned long long f) {
    c[threadIdx.x] = helper(a + b) + (int)(d * p.a) + p.b + (int)e + (int)f + c_coeffs[threadIdx.x % 16];
}

extern "C" __global__ void no_params() { atomicAdd(&d_counter, 1); }

extern "C" __global__ void use_tables(float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = d_table[i % 100] + c_bytes[i % 3];
}
