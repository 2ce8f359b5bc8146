// Warp votes (__ballot_sync, __any_sync, __all_sync), votes under divergence with
// explicit member masks, and __syncwarp-ordered shared-memory exchange.
// All kernels need blockDim a multiple of 32; out-of-range lanes still vote.
#define FULL_MASK 0xffffffffu

extern "C" __global__ void warp_votes(const int* in, unsigned* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned lane = threadIdx.x & 31;
    int v = (i < n) ? in[i] : 0;
    unsigned ballot = __ballot_sync(FULL_MASK, v > 0);
    int any7 = __any_sync(FULL_MASK, v == 7);
    int all_even = __all_sync(FULL_MASK, (v & 1) == 0);
    if (i < n) {
        unsigned* o = out + (size_t)i * 4;
        o[0] = ballot;
        o[1] = any7 ? 1u : 0u;
        o[2] = all_even ? 1u : 0u;
        o[3] = __popc(ballot & ((1u << lane) - 1u));   // rank among positive lanes
    }
}

// Odd lanes, even low lanes and even high lanes vote separately with masks that
// name exactly the lanes of their branch. Then a loop with per-lane trip counts,
// and a full-warp ballot after reconvergence. n = gridDim.x * blockDim.x exactly.
extern "C" __global__ void warp_vote_divergent(const int* in, unsigned* out)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned lane = threadIdx.x & 31;
    int v = in[i];
    unsigned r0, r1;
    if (lane & 1) {
        r0 = __ballot_sync(0xaaaaaaaau, v > 0);
        r1 = __any_sync(0xaaaaaaaau, v > 100) ? 1u : 0u;
    } else if (lane < 16) {
        r0 = __ballot_sync(0x00005555u, v < 0);
        r1 = __all_sync(0x00005555u, v != 0) ? 1u : 0u;
    } else {
        r0 = __ballot_sync(0x55550000u, (v & 3) == 0);
        r1 = __all_sync(0x55550000u, v > -50) ? 1u : 0u;
    }
    int acc = 0;
    for (int k = 0; k < (v & 15); ++k) {
        acc += k * v;
    }
    unsigned r2 = __ballot_sync(FULL_MASK, acc > 50);
    out[3 * i] = r0;
    out[3 * i + 1] = r1;
    out[3 * i + 2] = r2;
}

// Lanes exchange values through shared memory, ordered only by __syncwarp. blockDim <= 256.
extern "C" __global__ void syncwarp_exchange(const int* in, int* out)
{
    __shared__ int s[256];
    int tid = threadIdx.x;
    int i = blockIdx.x * blockDim.x + tid;
    int lane = tid & 31;
    int base = tid & ~31;
    s[tid] = in[i];
    __syncwarp();
    int a = s[base + ((lane + 5) & 31)];
    __syncwarp();
    s[tid] = a * 2 + lane;
    __syncwarp();
    out[i] = s[base + (31 - lane)];
}
