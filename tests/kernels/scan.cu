// Block-level inclusive prefix sums; each block scans its own segment.

// Hillis-Steele (step-efficient) with a double buffer; blockDim <= 512.
extern "C" __global__ void scan_hillis_steele(const int* in, int* out, int n)
{
    __shared__ int buf[2][512];
    int tid = threadIdx.x;
    int i = blockIdx.x * blockDim.x + tid;
    int pout = 0, pin = 1;
    buf[pout][tid] = (i < n) ? in[i] : 0;
    __syncthreads();
    for (int offset = 1; offset < blockDim.x; offset <<= 1) {
        pout = 1 - pout;
        pin = 1 - pout;
        if (tid >= offset) {
            buf[pout][tid] = buf[pin][tid] + buf[pin][tid - offset];
        } else {
            buf[pout][tid] = buf[pin][tid];
        }
        __syncthreads();
    }
    if (i < n) out[i] = buf[pout][tid];
}

// Blelloch (work-efficient) up-sweep / down-sweep over 2*blockDim elements
// (blockDim a power of two <= 512); the exclusive result plus the input gives the inclusive scan.
extern "C" __global__ void scan_blelloch(const int* in, int* out, int n)
{
    __shared__ int s[1024];
    int tid = threadIdx.x;
    int m = 2 * blockDim.x;
    int a = blockIdx.x * m + 2 * tid;
    int va = (a < n) ? in[a] : 0;
    int vb = (a + 1 < n) ? in[a + 1] : 0;
    s[2 * tid] = va;
    s[2 * tid + 1] = vb;
    int offset = 1;
    for (int d = m >> 1; d > 0; d >>= 1) {
        __syncthreads();
        if (tid < d) {
            int ai = offset * (2 * tid + 1) - 1;
            int bi = offset * (2 * tid + 2) - 1;
            s[bi] += s[ai];
        }
        offset <<= 1;
    }
    if (tid == 0) s[m - 1] = 0;
    for (int d = 1; d < m; d <<= 1) {
        offset >>= 1;
        __syncthreads();
        if (tid < d) {
            int ai = offset * (2 * tid + 1) - 1;
            int bi = offset * (2 * tid + 2) - 1;
            int t = s[ai];
            s[ai] = s[bi];
            s[bi] += t;
        }
    }
    __syncthreads();
    if (a < n) out[a] = s[2 * tid] + va;
    if (a + 1 < n) out[a + 1] = s[2 * tid + 1] + vb;
}
