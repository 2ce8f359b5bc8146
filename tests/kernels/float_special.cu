// IEEE special values (NaN, +-Inf, +-0, denormals) through min/max, copysign,
// basic arithmetic, correctly rounded division and sqrt, and classification.
#define OPS 10

// out: n x OPS floats.
extern "C" __global__ void float_special(const float* a, const float* b, float* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = a[i], y = b[i];
    float* o = out + (size_t)i * OPS;
    o[0] = fminf(x, y);
    o[1] = fmaxf(x, y);
    o[2] = copysignf(x, y);
    o[3] = x + y;
    o[4] = x * y;
    o[5] = fabsf(x) - y;
    o[6] = x / y;
    o[7] = sqrtf(x);
    o[8] = (float)((isnan(x) ? 1 : 0) + (isinf(x) ? 2 : 0) + (signbit(x) ? 4 : 0) + (isfinite(y) ? 8 : 0));
    o[9] = (float)((x < y ? 1 : 0) + (x == y ? 2 : 0) + (x >= y ? 4 : 0) + (x != y ? 8 : 0));
}
