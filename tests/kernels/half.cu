// Half precision: f32 <-> f16 conversion round trips and basic f16 arithmetic.
#include <cuda_fp16.h>

extern "C" __global__ void half_roundtrip(const float* in, unsigned short* h_out, float* f_out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __half h = __float2half(in[i]);
    h_out[i] = __half_as_ushort(h);
    f_out[i] = __half2float(h);
}

// out: n x 4 halves (add, sub, mul, and 1/0 for a < b).
extern "C" __global__ void half_arith(const unsigned short* a, const unsigned short* b, unsigned short* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __half x = __ushort_as_half(a[i]);
    __half y = __ushort_as_half(b[i]);
    unsigned short* o = out + (size_t)i * 4;
    o[0] = __half_as_ushort(__hadd(x, y));
    o[1] = __half_as_ushort(__hsub(x, y));
    o[2] = __half_as_ushort(__hmul(x, y));
    o[3] = __hlt(x, y) ? 1 : 0;
}
