// Calls to __noinline__ device functions (PTX .func + call): scalar, pointer and
// struct parameters, struct return, and genuine (non-tail) recursion.
struct Pair {
    int lo;
    float hi;
};

__device__ __noinline__ int mix(int a, int b, int c)
{
    return a * 31 + (b ^ c) - (a >> 2);
}

__device__ __noinline__ float lerp_rn(float a, float b, float t)
{
    return __fadd_rn(a, __fmul_rn(t, __fsub_rn(b, a)));
}

__device__ __noinline__ void write_pair(int* p, int a, int b)
{
    p[0] = a;
    p[1] = b;
}

__device__ __noinline__ Pair make_pair(int v, float f)
{
    Pair p;
    p.lo = v * 3;
    p.hi = __fmul_rn(f, 0.5f);
    return p;
}

__device__ __noinline__ int pair_sum(Pair p)
{
    return p.lo + (int)p.hi;
}

__device__ __noinline__ int fib(int n)
{
    return n < 2 ? n : fib(n - 1) + fib(n - 2);
}

// out_i: n x 5 ints, out_f: n floats.
extern "C" __global__ void device_calls(const int* a, const int* b, const float* f, int* out_i, float* out_f, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int x = a[i], y = b[i];
    int* o = out_i + (size_t)i * 5;
    o[0] = mix(x, y, i);
    write_pair(o + 1, y, x);
    Pair p = make_pair(x, f[i]);
    o[3] = pair_sum(p);
    o[4] = fib((x & 7) + 4);
    out_f[i] = lerp_rn(f[i], (float)y, 0.25f);
}
