// Cooperative launches through NVIDIA's runtime: cudaLaunchCooperativeKernel with
// cooperative groups' grid-wide barrier, the occupancy API that sizes such a grid, the
// attribute that says a device can, a grid too large for the device refused with
// cudaErrorCooperativeLaunchTooLarge, and grid.sync() outside a cooperative launch.
// Built for compute_70 (a grid barrier needs compute 6.0). Self-checking.
#include <cooperative_groups.h>

#include <vector>

#include "check.h"

namespace cg = cooperative_groups;

// Each phase moves every value one block further around a ring, with grid barriers between
// reading and writing: without a real barrier the values land in the wrong place.
__global__ void ring(int *data, int *out, int phases)
{
    cg::grid_group g = cg::this_grid();
    unsigned n = g.size();
    unsigned i = g.thread_rank();
    data[i] = (int)i;
    for (int p = 0; p < phases; ++p) {
        g.sync();
        int next = data[(i + blockDim.x) % n];
        g.sync();
        data[i] = next;
    }
    g.sync();
    out[i] = data[i];
}

// A grid-wide sum: every block adds its part, waits for the others, and block 0 reads it.
__global__ void grid_sum(const int *in, int *partial, int *total, int n)
{
    cg::grid_group g = cg::this_grid();
    __shared__ int block_sum;
    if (threadIdx.x == 0) block_sum = 0;
    __syncthreads();
    for (unsigned i = g.thread_rank(); i < (unsigned)n; i += g.size()) atomicAdd(&block_sum, in[i]);
    __syncthreads();
    if (threadIdx.x == 0) partial[blockIdx.x] = block_sum;
    g.sync();
    if (g.thread_rank() == 0) {
        int s = 0;
        for (unsigned b = 0; b < gridDim.x; ++b) s += partial[b];
        *total = s;
    }
}

__global__ void is_valid(int *out) { *out = cg::this_grid().is_valid() ? 1 : 0; }

int main()
{
    g_program = "cooperative";
    if (!device_present())
        return finish();
    int coop = 0, sms = 0;
    CHECK_CUDA("cudaDevAttrCooperativeLaunch",
               cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
    CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CHECK("the device launches cooperatively", coop == 1, "attribute %d", coop);

    const int threads = 64;
    int per_sm = 0;
    CHECK_CUDA("occupancy of the cooperative kernel",
               cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ring, threads, 0));
    int blocks = per_sm * sms;
    if (blocks > 8) blocks = 8; // enough to prove the barrier, quick to interpret
    CHECK("a grid of several blocks fits", blocks >= 2, "%d per SM x %d SMs", per_sm, sms);

    const int n = blocks * threads, phases = 4;
    int *data, *out;
    REQUIRE(cudaMalloc(&data, n * sizeof(int)));
    REQUIRE(cudaMalloc(&out, n * sizeof(int)));
    int ph = phases;
    void *args[] = {&data, &out, &ph};
    CHECK_CUDA("cudaLaunchCooperativeKernel",
               cudaLaunchCooperativeKernel((void *)ring, dim3(blocks), dim3(threads), args, 0, 0));
    CHECK_CUDA("the cooperative kernel completes", cudaDeviceSynchronize());
    std::vector<int> got(n);
    CUDA_OK(cudaMemcpy(got.data(), out, n * sizeof(int), cudaMemcpyDeviceToHost));
    long bad = -1;
    for (int i = 0; i < n; ++i)
        if (got[i] != (i + phases * threads) % n) { bad = i; break; }
    CHECK("grid.sync() orders every block", bad < 0, "element %ld: got %d", bad,
          bad < 0 ? 0 : got[bad]);

    std::vector<int> in(1000);
    long want = 0;
    for (int i = 0; i < 1000; ++i) { in[i] = i % 37; want += in[i]; }
    int *din, *partial, *total;
    REQUIRE(cudaMalloc(&din, in.size() * sizeof(int)));
    REQUIRE(cudaMalloc(&partial, blocks * sizeof(int)));
    REQUIRE(cudaMalloc(&total, sizeof(int)));
    CUDA_OK(cudaMemcpy(din, in.data(), in.size() * sizeof(int), cudaMemcpyHostToDevice));
    int count = (int)in.size();
    void *sum_args[] = {&din, &partial, &total, &count};
    cudaStream_t s;
    CUDA_OK(cudaStreamCreate(&s));
    CHECK_CUDA("cudaLaunchCooperativeKernel on a stream",
               cudaLaunchCooperativeKernel((void *)grid_sum, dim3(blocks), dim3(threads), sum_args,
                                           0, s));
    int sum = -1;
    CUDA_OK(cudaMemcpyAsync(&sum, total, sizeof sum, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CHECK("a grid-wide sum", sum == want, "got %d want %ld", sum, want);

    // Larger than the device holds at once: refused, nothing runs, the context goes on.
    int too_many = per_sm * sms + 1;
    cudaError_t e = cudaLaunchCooperativeKernel((void *)ring, dim3(too_many), dim3(threads), args,
                                                0, 0);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    CHECK("a grid larger than the device holds is refused",
          e == cudaErrorCooperativeLaunchTooLarge, "%d (%s)", (int)e, cudaGetErrorName(e));
    cudaGetLastError();

    int *valid;
    REQUIRE(cudaMalloc(&valid, sizeof(int)));
    void *valid_args[] = {&valid};
    int v = -1;
    CUDA_OK(cudaLaunchCooperativeKernel((void *)is_valid, dim3(2), dim3(32), valid_args, 0, 0));
    CUDA_OK(cudaMemcpy(&v, valid, sizeof v, cudaMemcpyDeviceToHost));
    CHECK("this_grid() is valid in a cooperative launch", v == 1, "%d", v);
    is_valid<<<2, 32>>>(valid);
    CUDA_OK(cudaMemcpy(&v, valid, sizeof v, cudaMemcpyDeviceToHost));
    CHECK("and not in an ordinary one", v == 0, "%d", v);

    cudaFree(data);
    cudaFree(out);
    cudaFree(din);
    cudaFree(partial);
    cudaFree(total);
    cudaFree(valid);
    cudaStreamDestroy(s);
    return finish();
}
