// Bit-manipulation intrinsics: popc, clz, brev, ffs, byte_perm, funnel shifts,
// high multiplies, and raw prmt with sign replication.
#define OPS32 14

// out: n x OPS32.
extern "C" __global__ void bitops32(const unsigned* a, const unsigned* b, unsigned* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned x = a[i], y = b[i];
    unsigned s = y & 31;
    unsigned* o = out + (size_t)i * OPS32;
    o[0] = __popc(x);
    o[1] = __clz(x);
    o[2] = __brev(x);
    o[3] = __ffs(x);
    o[4] = __byte_perm(x, y, y & 0x7777);
    o[5] = __funnelshift_l(x, y, y);
    o[6] = __funnelshift_r(x, y, y);
    o[7] = __funnelshift_lc(x, y, y & 63);
    o[8] = __funnelshift_rc(x, y, y & 63);
    o[9] = s ? ((x << s) | (x >> (32 - s))) : x;
    o[10] = __umulhi(x, y);
    o[11] = (unsigned)__mulhi((int)x, (int)y);
    unsigned p;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(p) : "r"(x), "r"(y), "r"(y >> 16));
    o[12] = p;
    o[13] = (unsigned)((int)x >> s);
}

// out: n x 4.
extern "C" __global__ void bitops64(const unsigned long long* a, unsigned long long* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned long long x = a[i];
    unsigned long long* o = out + (size_t)i * 4;
    o[0] = (unsigned long long)__popcll(x);
    o[1] = (unsigned long long)__clzll((long long)x);
    o[2] = __brevll(x);
    o[3] = (unsigned long long)__ffsll((long long)x);
}
