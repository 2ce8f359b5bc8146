// Asynchronous copies and split barriers as CUDA 11 introduced them (built for compute_80, where
// they compile to cp.async and mbarrier): cooperative groups' memcpy_async, cuda::barrier with
// cuda::memcpy_async over several phases, arrive/wait with tokens while one warp arrives late,
// arrive_and_drop, cuda::pipeline, and a warp that spins with __nanosleep until another warp of
// its block sets a flag. Each against the host's answer.
#include "check.h"

#include <cooperative_groups.h>
#include <cooperative_groups/memcpy_async.h>
#include <cooperative_groups/reduce.h>
#include <cuda/barrier>
#include <cuda/pipeline>

#include <vector>

// A barrier in shared memory is initialised by one thread with init(), as the CUDA guide shows.
#pragma nv_diag_suppress static_var_with_dynamic_init

namespace cg = cooperative_groups;
using block_barrier = cuda::barrier<cuda::thread_scope_block>;

constexpr int TILE = 256;

// Each block sums 2 * in[] over its tile, staged in shared memory by cg::memcpy_async.
__global__ void staged_sum(const float *in, float *out)
{
    __shared__ float tile[TILE];
    auto block = cg::this_thread_block();
    cg::memcpy_async(block, tile, in + blockIdx.x * TILE, sizeof(float) * TILE);
    cg::wait(block);
    auto warp = cg::tiled_partition<32>(block);
    float s = cg::reduce(warp, tile[threadIdx.x] * 2.0f, cg::plus<float>());
    if (warp.thread_rank() == 0) atomicAdd(out, s);
}

// Double-buffered tiles: while the block works on tile t, cuda::memcpy_async fills the other
// buffer, each buffer with a barrier of its own; out[i] = 3 * in[i] + tile index.
__global__ void double_buffered(const int *in, int *out, int tiles)
{
    __shared__ int buf[2][TILE];
    __shared__ block_barrier bars[2];
    auto block = cg::this_thread_block();
    if (block.thread_rank() == 0) {
        init(&bars[0], block.size());
        init(&bars[1], block.size());
    }
    block.sync();
    cuda::memcpy_async(block, buf[0], in, sizeof(int) * TILE, bars[0]);
    for (int t = 0; t < tiles; ++t) {
        if (t + 1 < tiles)
            cuda::memcpy_async(block, buf[(t + 1) % 2], in + (t + 1) * TILE, sizeof(int) * TILE, bars[(t + 1) % 2]);
        bars[t % 2].arrive_and_wait();
        out[t * TILE + threadIdx.x] = 3 * buf[t % 2][threadIdx.x] + t;
        block.sync();
    }
}

// Warp 0 arrives late: everything it writes before arriving is seen by every thread after
// its wait. Phase after phase, with tokens.
__global__ void late_arrival(int *out, int phases)
{
    __shared__ int value[4];
    __shared__ block_barrier bar;
    auto block = cg::this_thread_block();
    if (block.thread_rank() == 0) init(&bar, block.size());
    block.sync();
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int sum = 0;
    for (int p = 0; p < phases; ++p) {
        if (warp == 0) {
            // Busy work before arriving.
            int v = 0;
            for (int i = 0; i < 200; ++i) v += (i * (p + 1)) % 7;
            if (lane == 0) value[p % 4] = v + p;
        }
        block_barrier::arrival_token token = bar.arrive();
        bar.wait(std::move(token));
        sum += value[p % 4];
        block.sync();
    }
    out[threadIdx.x] = sum;
}

// Warps 2 and 3 leave after the first phase with arrive_and_drop; warps 0 and 1 go on alone.
__global__ void drop_out(int *out)
{
    __shared__ block_barrier bar;
    __shared__ int count;
    auto block = cg::this_thread_block();
    if (block.thread_rank() == 0) {
        init(&bar, block.size());
        count = 0;
    }
    block.sync();
    atomicAdd(&count, 1);
    int warp = threadIdx.x / 32;
    if (warp >= 2) {
        bar.arrive_and_drop();
        return;
    }
    bar.arrive_and_wait();
    int first = count;
    bar.arrive_and_wait();
    atomicAdd(&count, 1);
    bar.arrive_and_wait();
    out[threadIdx.x] = first * 1000 + count;
}

// A two-stage pipeline per thread: stage s copies in[s * n + i] while the thread consumes the
// previous stage.
__global__ void pipelined(const int *in, int *out, int stages)
{
    __shared__ int buf[2][TILE];
    auto pipe = cuda::make_pipeline();
    int i = threadIdx.x, acc = 0;
    pipe.producer_acquire();
    cuda::memcpy_async(&buf[0][i], &in[i], sizeof(int), pipe);
    pipe.producer_commit();
    for (int s = 0; s < stages; ++s) {
        if (s + 1 < stages) {
            pipe.producer_acquire();
            cuda::memcpy_async(&buf[(s + 1) % 2][i], &in[(s + 1) * TILE + i], sizeof(int), pipe);
            pipe.producer_commit();
        }
        cuda::pipeline_consumer_wait_prior<1>(pipe);
        if (s + 1 == stages) cuda::pipeline_consumer_wait_prior<0>(pipe);
        acc = acc * 2 + buf[s % 2][i];
        pipe.consumer_release();
    }
    out[i] = acc;
}

// Warp 0 spins, backing off with __nanosleep, until warp 1 sets the flag.
__global__ void spin_on_another_warp(int *out)
{
    __shared__ volatile int flag;
    if (threadIdx.x == 0) flag = 0;
    __syncthreads();
    int warp = threadIdx.x / 32, spins = 0;
    if (warp == 0) {
        while (flag == 0) {
            __nanosleep(100);
            ++spins;
        }
    } else if (threadIdx.x == 32) {
        flag = 42;
    }
    __syncwarp();
    out[threadIdx.x] = warp == 0 ? flag : 7;
}

int main()
{
    g_program = "async_copies";
    {
        const int blocks = 4;
        std::vector<float> h(blocks * TILE);
        double want = 0;
        for (size_t i = 0; i < h.size(); ++i) h[i] = float(i % 7), want += 2 * h[i];
        float *d = nullptr, *o = nullptr;
        CUDA_OK(cudaMalloc(&d, h.size() * sizeof(float)));
        CUDA_OK(cudaMalloc(&o, sizeof(float)));
        CUDA_OK(cudaMemset(o, 0, sizeof(float)));
        CUDA_OK(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
        staged_sum<<<blocks, TILE>>>(d, o);
        CUDA_OK(cudaGetLastError());
        float r = 0;
        CUDA_OK(cudaMemcpy(&r, o, sizeof r, cudaMemcpyDeviceToHost));
        CHECK("cooperative groups memcpy_async, wait and reduce", r == want, "%f, want %f", r, want);
        CUDA_OK(cudaFree(d));
        CUDA_OK(cudaFree(o));
    }
    const int tiles = 5;
    std::vector<int> in(tiles * TILE);
    for (size_t i = 0; i < in.size(); ++i) in[i] = int(i * 7 % 1001);
    int *din = nullptr, *dout = nullptr;
    CUDA_OK(cudaMalloc(&din, in.size() * sizeof(int)));
    CUDA_OK(cudaMalloc(&dout, in.size() * sizeof(int)));
    CUDA_OK(cudaMemcpy(din, in.data(), in.size() * sizeof(int), cudaMemcpyHostToDevice));
    std::vector<int> out(in.size());
    auto fetch = [&](size_t n) {
        CUDA_OK(cudaMemcpy(out.data(), dout, n * sizeof(int), cudaMemcpyDeviceToHost));
    };

    double_buffered<<<1, TILE>>>(din, dout, tiles);
    CUDA_OK(cudaGetLastError());
    fetch(in.size());
    int bad = -1;
    for (size_t i = 0; i < in.size() && bad < 0; ++i)
        if (out[i] != 3 * in[i] + int(i / TILE)) bad = int(i);
    CHECK("cuda::barrier and cuda::memcpy_async, double-buffered over 5 phases", bad < 0, "out[%d] = %d", bad,
          bad < 0 ? 0 : out[bad]);

    const int phases = 6;
    late_arrival<<<1, 128>>>(dout, phases);
    CUDA_OK(cudaGetLastError());
    fetch(128);
    int want_late = 0;
    for (int p = 0; p < phases; ++p) {
        int v = 0;
        for (int i = 0; i < 200; ++i) v += (i * (p + 1)) % 7;
        want_late += v + p;
    }
    bad = -1;
    for (int i = 0; i < 128 && bad < 0; ++i)
        if (out[i] != want_late) bad = i;
    CHECK("arrive and wait with tokens while one warp arrives late", bad < 0, "thread %d saw %d, want %d", bad,
          bad < 0 ? 0 : out[bad], want_late);

    drop_out<<<1, 128>>>(dout);
    CUDA_OK(cudaGetLastError());
    fetch(64);
    bad = -1;
    for (int i = 0; i < 64 && bad < 0; ++i)
        if (out[i] != 128 * 1000 + 192) bad = i;
    CHECK("arrive_and_drop: the others go on without the warps that left", bad < 0, "thread %d: %d", bad,
          bad < 0 ? 0 : out[bad]);

    const int stages = 4;
    pipelined<<<1, TILE>>>(din, dout, stages);
    CUDA_OK(cudaGetLastError());
    fetch(TILE);
    bad = -1;
    for (int i = 0; i < TILE && bad < 0; ++i) {
        int acc = 0;
        for (int s = 0; s < stages; ++s) acc = acc * 2 + in[s * TILE + i];
        if (out[i] != acc) bad = i;
    }
    CHECK("cuda::pipeline of two stages", bad < 0, "out[%d] = %d", bad, bad < 0 ? 0 : out[bad]);

    spin_on_another_warp<<<1, 64>>>(dout);
    CUDA_OK(cudaGetLastError());
    fetch(64);
    CHECK("a warp spinning with __nanosleep sees another warp's write", out[0] == 42 && out[31] == 42 && out[32] == 7,
          "%d %d %d", out[0], out[31], out[32]);
    CUDA_OK(cudaFree(din));
    CUDA_OK(cudaFree(dout));
    return finish();
}
