// 64-bit integer arithmetic: mul, signed/unsigned div and rem, shifts, high-half multiplies.
#define OPS 12

extern "C" __global__ void int64_ops(const long long* a, const long long* b, const unsigned* sh, long long* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long x = a[i], y = b[i];
    unsigned long long ux = (unsigned long long)x, uy = (unsigned long long)y;
    unsigned s = sh[i] & 63;
    long long* o = out + (size_t)i * OPS;
    o[0] = (long long)(ux * uy);
    o[1] = x / y;
    o[2] = x % y;
    o[3] = (long long)(ux / uy);
    o[4] = (long long)(ux % uy);
    o[5] = (long long)(ux << s);
    o[6] = x >> s;
    o[7] = (long long)(ux >> s);
    o[8] = (long long)__umul64hi(ux, uy);
    o[9] = __mul64hi(x, y);
    o[10] = (long long)(ux - uy * 3u);
    o[11] = (long long)(int)x * (long long)(int)y;
}
