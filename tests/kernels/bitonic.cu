// In-block bitonic sort of 1024-element segments in shared memory (blockDim = 512,
// one compare-exchange per thread per step). The tail of a partial last segment is
// padded with 0xffffffff, which sorts to the end and is not written back.
#define SEG 1024

extern "C" __global__ void bitonic_sort_block(const unsigned* in, unsigned* out, unsigned n)
{
    __shared__ unsigned s[SEG];
    unsigned tid = threadIdx.x;
    unsigned base = blockIdx.x * SEG;
    for (unsigned t = tid; t < SEG; t += blockDim.x) {
        s[t] = (base + t < n) ? in[base + t] : 0xffffffffu;
    }
    for (unsigned k = 2; k <= SEG; k <<= 1) {
        for (unsigned j = k >> 1; j > 0; j >>= 1) {
            __syncthreads();
            unsigned i = 2 * tid - (tid & (j - 1));
            unsigned p = i + j;
            bool ascending = (i & k) == 0;
            unsigned a = s[i], b = s[p];
            if ((a > b) == ascending) {
                s[i] = b;
                s[p] = a;
            }
        }
    }
    __syncthreads();
    for (unsigned t = tid; t < SEG; t += blockDim.x) {
        if (base + t < n) out[base + t] = s[t];
    }
}
