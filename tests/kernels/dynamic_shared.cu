// Dynamic shared memory (extern __shared__), sized at launch.

// Reverses each block's segment; needs blockDim * 4 bytes.
extern "C" __global__ void dyn_shared_reverse(const int* in, int* out, int n)
{
    extern __shared__ int s[];
    int tid = threadIdx.x;
    int i = blockIdx.x * blockDim.x + tid;
    s[tid] = (i < n) ? in[i] : -1;
    __syncthreads();
    if (i < n) out[i] = s[blockDim.x - 1 - tid];
}

// Carves a double array and an int array out of one dynamic allocation;
// needs blockDim * 12 bytes.
extern "C" __global__ void dyn_shared_mixed(const double* in, double* out, int n)
{
    extern __shared__ double sd[];
    double* d = sd;
    int* counts = (int*)(sd + blockDim.x);
    int tid = threadIdx.x;
    int i = blockIdx.x * blockDim.x + tid;
    d[tid] = (i < n) ? in[i] : 0.0;
    counts[tid] = tid * 3 + 1;
    __syncthreads();
    if (i < n) out[i] = d[(tid + 1) % blockDim.x] + (double)counts[blockDim.x - 1 - tid];
}

// Static and dynamic shared memory in one kernel: the dynamic array must not
// overlap the static one. Needs blockDim * 4 bytes of dynamic memory; blockDim <= 64.
extern "C" __global__ void dyn_shared_with_static(const int* in, int* out, int n)
{
    __shared__ int stat[64];
    extern __shared__ int dyn[];
    int tid = threadIdx.x;
    int i = blockIdx.x * blockDim.x + tid;
    int v = (i < n) ? in[i] : 0;
    stat[tid] = v * 2;
    dyn[tid] = v + 7;
    __syncthreads();
    int j = blockDim.x - 1 - tid;
    if (i < n) out[i] = stat[j] - dyn[j] + stat[tid];
}
