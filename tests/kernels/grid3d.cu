// 3-D grid and block indexing: each point of an nx x ny x nz volume records which
// block and thread wrote it, and the grid/block dimensions it saw.
extern "C" __global__ void grid3d_index(unsigned* out, unsigned nx, unsigned ny, unsigned nz)
{
    unsigned x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned y = blockIdx.y * blockDim.y + threadIdx.y;
    unsigned z = blockIdx.z * blockDim.z + threadIdx.z;
    if (x >= nx || y >= ny || z >= nz) return;
    unsigned idx = (z * ny + y) * nx + x;
    out[3 * idx] = (blockIdx.z << 20) | (blockIdx.y << 10) | blockIdx.x;
    out[3 * idx + 1] = (threadIdx.z << 20) | (threadIdx.y << 10) | threadIdx.x;
    out[3 * idx + 2] = (gridDim.z << 24) | (gridDim.y << 16) | (gridDim.x << 8) | (blockDim.z << 6) | (blockDim.y << 3) | blockDim.x;
}
