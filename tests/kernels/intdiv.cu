// Integer division and remainder corner cases: signs, INT_MIN / -1, unsigned
// views of the same bits, 64-bit, and constant divisors the compiler turns into
// shifts and multiply-high sequences.

// out: n x 4 (signed quotient, signed remainder, unsigned quotient, unsigned remainder).
extern "C" __global__ void intdiv32(const int* a, const int* b, int* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int x = a[i], y = b[i];
    int* o = out + (size_t)i * 4;
    o[0] = x / y;
    o[1] = x % y;
    o[2] = (int)((unsigned)x / (unsigned)y);
    o[3] = (int)((unsigned)x % (unsigned)y);
}

extern "C" __global__ void intdiv64(const long long* a, const long long* b, long long* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long x = a[i], y = b[i];
    long long* o = out + (size_t)i * 4;
    o[0] = x / y;
    o[1] = x % y;
    o[2] = (long long)((unsigned long long)x / (unsigned long long)y);
    o[3] = (long long)((unsigned long long)x % (unsigned long long)y);
}

// out: n x 10.
extern "C" __global__ void intdiv_const(const int* a, int* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int x = a[i];
    unsigned u = (unsigned)x;
    int* o = out + (size_t)i * 10;
    o[0] = x / 8;
    o[1] = x % 8;
    o[2] = x / -4;
    o[3] = x / 7;
    o[4] = x % 7;
    o[5] = x / -1000;
    o[6] = (int)(u / 16u);
    o[7] = (int)(u % 16u);
    o[8] = (int)(u / 10u);
    o[9] = (int)(u % 3u);
}
