// Rounding-mode intrinsics and conversions: directed-rounding multiplies, fma,
// correctly rounded division / sqrt / reciprocal, f64 -> f32 in all four modes,
// and float -> int conversions (with saturation and NaN -> 0).
#define FOPS 12
#define IOPS 10

// out: n x FOPS floats.
extern "C" __global__ void fp_directed(const float* a, const float* b, const double* d, float* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = a[i], y = b[i];
    double z = d[i];
    float* o = out + (size_t)i * FOPS;
    o[0] = __fmul_rn(x, y);
    o[1] = __fmul_rz(x, y);
    o[2] = __fmul_rd(x, y);
    o[3] = __fmul_ru(x, y);
    o[4] = __fmaf_rn(x, y, x);
    o[5] = __fdiv_rn(x, y);
    o[6] = __fsqrt_rn(fabsf(x));
    o[7] = __frcp_rn(y);
    o[8] = __double2float_rn(z);
    o[9] = __double2float_rz(z);
    o[10] = __double2float_rd(z);
    o[11] = __double2float_ru(z);
}

// out: n x IOPS ints (64-bit values are split into two ints, low word first).
extern "C" __global__ void fp_convert(const float* a, const double* d, int* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = a[i];
    double z = d[i];
    int* o = out + (size_t)i * IOPS;
    o[0] = __float2int_rn(x);
    o[1] = __float2int_rz(x);
    o[2] = __float2int_rd(x);
    o[3] = __float2int_ru(x);
    o[4] = (int)__float2uint_rz(x);
    o[5] = __double2int_rn(z);
    long long ll = __double2ll_rz(z);
    o[6] = (int)(unsigned)ll;
    o[7] = (int)(unsigned)((unsigned long long)ll >> 32);
    o[8] = __float_as_int(__int2float_rn((int)((unsigned)o[1] * 3u + 1u)));
    o[9] = __float_as_int(__uint2float_rz((unsigned)__double2ll_rz(z)));
}
