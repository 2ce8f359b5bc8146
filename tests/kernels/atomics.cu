// Atomics: compare-and-swap loops (float max, double add), atomicInc/atomicDec
// wrap-around, and the integer read-modify-write family.

__device__ float atomic_max_float(float* addr, float v)
{
    int* a = (int*)addr;
    int old = *a, assumed;
    do {
        assumed = old;
        if (__int_as_float(assumed) >= v) break;
        old = atomicCAS(a, assumed, __float_as_int(v));
    } while (old != assumed);
    return __int_as_float(old);
}

__device__ double atomic_add_double_cas(double* addr, double v)
{
    unsigned long long* a = (unsigned long long*)addr;
    unsigned long long old = *a, assumed;
    do {
        assumed = old;
        old = atomicCAS(a, assumed, __double_as_longlong(__longlong_as_double(assumed) + v));
    } while (old != assumed);
    return __longlong_as_double(old);
}

// result[0] must start at -inf; ends as max(in).
extern "C" __global__ void atomic_cas_float_max(const float* in, float* result, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomic_max_float(result, in[i]);
}

// result[0] must start at 0; ends as sum(in) (inputs chosen so every partial sum is exact).
extern "C" __global__ void atomic_cas_double_add(const double* in, double* result, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomic_add_double_cas(result, in[i]);
}

// counters[0] counts up with atomicInc (wraps to 0 past inc_limit), counters[1]
// counts down with atomicDec (wraps to dec_limit at 0). Each thread records the old value.
extern "C" __global__ void atomic_inc_dec(unsigned* counters, unsigned* olds_inc, unsigned* olds_dec,
                                          unsigned inc_limit, unsigned dec_limit, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    olds_inc[i] = atomicInc(&counters[0], inc_limit);
    olds_dec[i] = atomicDec(&counters[1], dec_limit);
}

// r (int[8]) and r64 (unsigned long long[2]) are initialised by the host.
extern "C" __global__ void atomic_int_ops(const int* in, int* r, unsigned long long* r64, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = in[i];
    atomicAdd(&r[0], v);
    atomicSub(&r[1], v);
    atomicMin(&r[2], v);
    atomicMax(&r[3], v);
    atomicAnd(&r[4], v | (int)(1u << (i & 31)));
    atomicOr(&r[5], v & 0x0f0f0f0f);
    atomicXor(&r[6], v);
    atomicMin((unsigned*)&r[7], (unsigned)v);
    atomicAdd(&r64[0], (unsigned long long)(long long)v * 0x10001ull);
    atomicMax(&r64[1], (unsigned long long)(unsigned)v << 20);
}
