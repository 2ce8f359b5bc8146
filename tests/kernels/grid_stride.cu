// Grid-stride loops: fewer threads than elements, in 1-D and 2-D.

// out[i] = (in[i] * a + b) ^ i, unsigned wrap-around arithmetic.
extern "C" __global__ void grid_stride_axpb(const unsigned* in, unsigned* out, unsigned n, unsigned a, unsigned b)
{
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        out[i] = (in[i] * a + b) ^ i;
    }
}

// Writes a w x h window of a pitched 2-D array; elements in the pitch gap stay untouched.
extern "C" __global__ void grid_stride_2d(int* out, int w, int h, int pitch)
{
    for (int y = blockIdx.y * blockDim.y + threadIdx.y; y < h; y += blockDim.y * gridDim.y) {
        for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < w; x += blockDim.x * gridDim.x) {
            out[y * pitch + x] = x * 1000 - y;
        }
    }
}
