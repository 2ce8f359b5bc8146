// A compute-bound kernel with a tunable cost, for the scheduler benchmark
// (`vgpu-bench share`) and tests/sched_*.rs. Every thread runs `iters`
// dependent multiply-adds and stores its result, so the work cannot be
// optimized away and each thread block costs the same.
// PTX: python3 bench/kernels/gen-ptx.py (NVRTC, compute_80) -> spin.ptx.
extern "C" __global__ void spin(float *out, unsigned int iters)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    float a = (float)threadIdx.x * 0.001f;
    for (unsigned int k = 0; k < iters; ++k) {
        a = a * 0.999f + 0.5f;
    }
    out[i] = a;
}
