// One Jacobi step of the 5-point Laplacian stencil on a w x h grid; boundary cells are copied.
#define BX 16
#define BY 16

extern "C" __global__ void stencil5(const float* in, float* out, int w, int h, float c)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= w || y >= h) return;
    int i = y * w + x;
    if (x == 0 || y == 0 || x == w - 1 || y == h - 1) {
        out[i] = in[i];
        return;
    }
    out[i] = in[i] + c * (in[i - 1] + in[i + 1] + in[i - w] + in[i + w] - 4.0f * in[i]);
}

// Same computation through a shared (BX+2) x (BY+2) tile with a one-cell halo; blockDim = (BX, BY).
extern "C" __global__ void stencil5_shared(const float* in, float* out, int w, int h, float c)
{
    __shared__ float t[BY + 2][BX + 2];
    int x = blockIdx.x * BX + threadIdx.x;
    int y = blockIdx.y * BY + threadIdx.y;
    int lx = threadIdx.x + 1, ly = threadIdx.y + 1;
    bool inside = x < w && y < h;
    if (inside) {
        t[ly][lx] = in[y * w + x];
        if (threadIdx.x == 0 && x > 0) t[ly][0] = in[y * w + x - 1];
        if ((threadIdx.x == BX - 1 || x == w - 1) && x + 1 < w) t[ly][lx + 1] = in[y * w + x + 1];
        if (threadIdx.y == 0 && y > 0) t[0][lx] = in[(y - 1) * w + x];
        if ((threadIdx.y == BY - 1 || y == h - 1) && y + 1 < h) t[ly + 1][lx] = in[(y + 1) * w + x];
    }
    __syncthreads();
    if (!inside) return;
    float centre = t[ly][lx];
    if (x == 0 || y == 0 || x == w - 1 || y == h - 1) {
        out[y * w + x] = centre;
        return;
    }
    out[y * w + x] = centre + c * (t[ly][lx - 1] + t[ly][lx + 1] + t[ly - 1][lx] + t[ly + 1][lx] - 4.0f * centre);
}
